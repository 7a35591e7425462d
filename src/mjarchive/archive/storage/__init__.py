"""Storage: everything between bytes and zarr. This room guards untrusted bytes.

`locations.py` turns a path or URL into a store; `local.py` is the local-disk store that never
follows a link; `checked.py` is the `CheckedStore` every read of an archive passes through, which
bounds each JSON document and each stored chunk or shard before zarr parses or decodes it, using the
layout rules of `chunk_layout.py`, and bounds in time each operation on an object store with the
defaults of `remote.py` (timeouts, retries, a deadline; StorageError); `shard_writer.py` writes
whole shards directly (the writer's fast path); `lease.py` is the writer lease that keeps one writer
per archive (an OS lock on local disks, conditional writes on S3 in `s3_lease.py`; its document and
interface in `lease_record.py`). May import `mjarchive._errors`, `mjarchive._fs` and the spec's constants in
`mjarchive.archive.format`, nothing else of the package (tests/test_layout.py).
"""
