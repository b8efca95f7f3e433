"""The ground every other package stands on; imports nothing of pipe but itself.

- `errors`: `PipelineError` and its subclasses, the one exception family the CLI maps to exit codes,
  and `first_line` (an exception's message as one line).
- `fsutil`: atomic writes (temp file, fsync, rename) and file hashing.
- `jsontypes`: dataclasses from parsed JSON, every nested field checked, problems named by dotted path.
- `arrays`: `Arrays`, the named numpy arrays every runner, protocol and gate passes around.
"""
