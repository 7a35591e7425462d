"""The archive format on disk: the manifest, the model bundle, stores, and the writer, reader and verifier (spec/)."""
