"""Create-if-absent writes: how the writers of a multi-part archive share its root document and model
bundle without ever writing one object twice (spec/README.md, "Parts"). The first writer creates
each object; every later one finds it there and leaves it alone."""

from __future__ import annotations

import asyncio
import errno
import warnings
import zarr.storage
from zarr.core.sync import sync

from ..._errors import FormatError, MjArchiveError, StorageError, UnenforcedWriterWarning
from .checked import CheckedStore
from .local import SafeLocalStore, write_file
from .prefixed import unprefixed
from .s3_lease import _precondition_failed, _s3_status, _unsupported

__all__ = ["create_if_absent", "is_s3"]


def create_if_absent(store: CheckedStore, key: str, data: bytes) -> bool:
    """Store `data` at `key` unless an object is there already, atomically where the store can (local
    disk: a link that fails if the name exists; S3: PutObject If-None-Match; memory): True if this
    call created it. Other object stores check then write (two writers could both write there)."""
    plain, prefix = unprefixed(store)
    full = prefix + key
    if isinstance(plain, SafeLocalStore):
        try:
            write_file(plain.root, full, memoryview(data), exclusive=True)
        except FileExistsError:
            return False
        except (NotADirectoryError, IsADirectoryError):
            raise FormatError(f"{full!r} cannot be written: a file stands where a folder belongs, or a folder where "
                              "a file belongs; the location holds something else than an archive") from None
        except OSError as exc:
            if exc.errno == errno.EEXIST:
                return False
            raise StorageError(f"creating {full!r} failed ({exc}); a multi-part archive creates its shared objects "
                               "with a hard link, which this file system may not support: write it to a local disk "
                               "or to object storage") from exc
        if key.endswith("zarr.json"):
            store._state.record(key, data)
        return True
    if isinstance(plain, zarr.storage.FsspecStore) and is_s3(plain):
        bucket, obj = plain.fs.split_path(f"{plain.path.rstrip('/')}/{full}")[:2]

        async def put() -> bool:
            for attempt in range(8):
                try:
                    await plain.fs._call_s3("put_object", Bucket=bucket, Key=obj, Body=data, IfNoneMatch="*")
                except Exception as exc:
                    if (unsupported := _unsupported(exc)) is not None:
                        raise unsupported from None
                    if not _precondition_failed(exc):
                        raise
                    if _s3_status(exc)[1] != 409:
                        return False  # 412: it exists
                    # 409: another conditional write of the key is in flight; once it lands, it exists
                    await asyncio.sleep(0.05 * 2 ** attempt)
                    continue
                return True
            raise StorageError(f"creating {full!r} conflicted with another writer's request 8 times; try again")

        try:
            created = sync(asyncio.wait_for(put(), store._remote.total_timeout if store._remote else 60.0))
        except MjArchiveError:
            raise
        except Exception as exc:
            raise StorageError(f"writing {full!r} failed: {exc!r}; check the connection, the credentials and "
                               "storage_options") from exc
        if created and key.endswith("zarr.json"):
            store._state.record(key, data)
        return created
    # Memory (one process: atomic) and other object stores (check, then write).
    if not isinstance(plain, zarr.storage.MemoryStore):
        warnings.warn(f"{type(plain).__name__} storage has no create-if-absent write here: two writers creating "
                      f"{full!r} at the same moment could both write it (they write the same bytes when they "
                      "record the same model)", UnenforcedWriterWarning, stacklevel=3)
    if sync(store.exists(key)):
        return False
    store.write_now(key, data)
    return True


def is_s3(store: zarr.storage.FsspecStore) -> bool:
    protocols = store.fs.protocol if isinstance(store.fs.protocol, (tuple, list)) else (store.fs.protocol,)
    return "s3" in protocols or "s3a" in protocols
