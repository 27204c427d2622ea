"""How tinygpt reads and writes its own files: infrastructure the checkpoints, the token shards,
``tinygpt prepare`` and the book's results cache share.

- ``reading``: a file opened only if it is a regular file (never blocking on a FIFO), of a
  bounded size, its SHA-256;
- ``writing``: files written whole and renamed into place, or created and flushed to the disk;
- ``locking``: the lock file one process holds (``flock``) while it writes a folder;
- ``manifest``: the JSON manifest a checkpoint or a shards folder carries (its format, version
  and checksum), and the tokenizer entry both write in it.
"""
