from entr_diag.cli import main

main()
