"""Input layer: find Parquet dumps, map columns, validate and account for bad rows."""

from entr_diag.io.load import Accounting, Dataset, FileInfo, bundled_sample_path, load_dataset

__all__ = ["Accounting", "Dataset", "FileInfo", "bundled_sample_path", "load_dataset"]
