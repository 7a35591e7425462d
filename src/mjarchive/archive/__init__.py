"""The archive format on disk (spec/): bytes in `storage/`, the model in `bundle/`, the format core here.

Floors, lowest first: `format.py` (the spec's constants and validators); `storage/` (stores, and the
checked store that guards untrusted bytes) and `bundle/` (the model bundle and its compile
sandbox); `variants.py` and `overlays.py` (format 1.1 features); `manifest.py` (root attributes);
`documents.py`, `events.py`, `verify.py`, `variant_window.py` (the variant values a replay's
selection draws), `creation.py` (a new archive's arrays); `reader.py` and
`writer.py` side by side, never importing each other; `opening.py` (`open()`) above both. The wing imports nothing of record/,
replay/, viewer/ or cli/.
"""
