"""A view of one folder of a store as a store of its own: a part of a multi-part archive is read and
written exactly as a single archive is, through its folder `parts/<name>/` seen as a root."""

from __future__ import annotations

from typing import Any

from zarr.storage import WrapperStore

__all__ = ["PrefixStore", "unprefixed"]


class PrefixStore(WrapperStore):
    """`store` with every key under `prefix` (which ends with '/'); listings are relative to it."""

    def __init__(self, store: Any, prefix: str = "") -> None:
        if not prefix.endswith("/") or prefix.startswith("/") or "//" in prefix:
            raise ValueError(f"a store prefix is a folder path ending with '/', got {prefix!r}")
        super().__init__(store)
        self.prefix = prefix

    def _with_store(self, store: Any) -> PrefixStore:
        return type(self)(store, self.prefix)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PrefixStore) and other.prefix == self.prefix and other._store == self._store

    def __hash__(self) -> int:
        return hash(self.prefix)

    def __repr__(self) -> str:
        return f"PrefixStore({self._store!r}, {self.prefix!r})"

    def sync_method(self, name: str) -> Any:
        """The wrapped store's synchronous `name` (get_sync, set_sync, ...) on prefixed keys, or None."""
        method = None if isinstance(self._store, WrapperStore) else getattr(self._store, name, None)
        if method is None:  # (a caller's wrapper must see every access, through the async methods)
            return None
        prefix = self.prefix
        return lambda key, *args, **kwargs: method(prefix + key, *args, **kwargs)

    async def is_empty(self, prefix: str) -> bool:
        return await self._store.is_empty(self.prefix + prefix)

    async def clear(self) -> None:
        await self._store.delete_dir(self.prefix.rstrip("/"))

    async def get(self, key: str, prototype: Any = None, byte_range: Any = None) -> Any:
        return await self._store.get(self.prefix + key, prototype, byte_range)

    async def get_partial_values(self, prototype: Any, key_ranges: Any) -> list:
        return await self._store.get_partial_values(prototype, [(self.prefix + k, r) for k, r in key_ranges])

    async def get_ranges(self, key: str, byte_ranges: Any, **kwargs: Any) -> Any:
        async for group in self._store.get_ranges(self.prefix + key, byte_ranges, **kwargs):
            yield group

    async def _get_many(self, requests: Any) -> Any:
        async for key, value in self._store._get_many([(self.prefix + k, p, r) for k, p, r in requests]):
            yield key[len(self.prefix):], value

    async def exists(self, key: str) -> bool:
        return await self._store.exists(self.prefix + key)

    async def set(self, key: str, value: Any) -> None:
        await self._store.set(self.prefix + key, value)

    async def set_if_not_exists(self, key: str, value: Any) -> None:
        await self._store.set_if_not_exists(self.prefix + key, value)

    async def _set_many(self, values: Any) -> None:
        await self._store._set_many([(self.prefix + k, v) for k, v in values])

    async def delete(self, key: str) -> None:
        await self._store.delete(self.prefix + key)

    async def delete_dir(self, prefix: str) -> None:
        await self._store.delete_dir((self.prefix + prefix).rstrip("/"))

    async def getsize(self, key: str) -> int:
        return await self._store.getsize(self.prefix + key)

    async def list(self) -> Any:
        async for key in self._store.list_prefix(self.prefix):
            yield key[len(self.prefix):]

    async def list_prefix(self, prefix: str) -> Any:
        async for key in self._store.list_prefix(self.prefix + prefix):
            yield key[len(self.prefix):]

    async def list_dir(self, prefix: str) -> Any:
        async for name in self._store.list_dir(self.prefix + prefix):
            yield name


def unprefixed(store: Any) -> tuple[Any, str]:
    """The store under a CheckedStore's PrefixStores, and the key prefix they add together."""
    plain, prefix = store._store, ""
    while isinstance(plain, PrefixStore):
        prefix, plain = plain.prefix + prefix, plain._store
    return plain, prefix
