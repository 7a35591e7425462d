"""The model bundle: one flattened MJCF plus its asset files, hashed, stored in the archive.

`model_bundle.py` collects, hashes, stores and reads the bundle (`ModelBundle`, `QposLayout`);
`xml_checks.py` refuses, from the XML text alone, what could reach outside the bundle or cost
unbounded memory; `sandbox.py` compiles an untrusted bundle in a child process (`compile_child.py`)
limited in memory and time, never in this process. May import `mjarchive._errors`, `mjarchive._fs`,
`mjarchive.archive.format` and `mjarchive.archive.storage`, nothing else of the package.
"""
