"""The archive format on disk (spec/): bytes in `storage/`, the model in `bundle/`, the format core here.

Floors, lowest first: `format.py` (the spec's constants and validators); `storage/` (stores, and the
checked store that guards untrusted bytes) and `bundle/` (the model bundle and its compile
sandbox); `variants.py` and `overlays.py` (format 1.1 features); `manifest.py` (root attributes);
`documents.py`, `events.py`, `verify.py`, `variant_window.py` (the variant values a replay's
selection draws), `creation.py` (a new archive's arrays), `parts.py` (multi-part archives' rules);
`reader.py` and `writer.py` side by side, never importing each other, with `parted_reader.py` (parts
read as one) and `joining.py` (a writer joining a multi-part archive) beside them; `opening.py`
(`open()`) above both; `compact.py` above that. The wing imports nothing of record/,
replay/, viewer/ or cli/.
"""
