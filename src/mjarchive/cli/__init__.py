"""The `mjarchive` command line: info, verify, render, preview, export-model and the demo."""
