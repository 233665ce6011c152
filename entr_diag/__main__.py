from entr_diag._entry import main

main()
