"""Reading the text files users give (scenarios, topologies, token files): a regular file of
bounded size, in UTF-8, or one line saying why not; and writing the files results go to
whole or not at all.

A named pipe would block the reader, ``/dev/zero`` would fill the memory and a binary file
would fail deep in a parser; each is refused here, before any of that, with the problem in
words (:class:`UnreadableFile`), which the caller puts after the file's name. A file written
with :func:`written_whole` replaces the one at its path only once all of it is written: a
disk that fills up leaves neither a truncated file nor an earlier good one destroyed.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

MAX_TEXT_BYTES = 256 << 20
"""The largest text file read (256 MiB: a topology of a hundred thousand GPUs is some tens)."""


class UnreadableFile(ValueError):
    """A text file that cannot be read; ``str()`` is the problem, without the file's name."""


def read_text_file(path: str | Path, max_bytes: int = MAX_TEXT_BYTES) -> str:
    """The text of the regular file ``path`` (UTF-8, at most ``max_bytes``).

    >>> import tempfile
    >>> with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
    ...     _ = f.write("name: x")
    >>> read_text_file(f.name)
    'name: x'
    >>> read_text_file(f.name, max_bytes=3)
    Traceback (most recent call last):
    ...
    fabricpilot.textfiles.UnreadableFile: larger than 3 bytes (7 bytes)
    >>> read_text_file("/dev/null")
    Traceback (most recent call last):
    ...
    fabricpilot.textfiles.UnreadableFile: not a regular file (a character device)
    """
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise UnreadableFile("file not found") from None
    except OSError as err:
        raise UnreadableFile(f"cannot read: {err.strerror or err}") from None
    if stat.S_ISDIR(st.st_mode):
        raise UnreadableFile("is a directory, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise UnreadableFile(f"not a regular file ({_kind(st.st_mode)})")
    if st.st_size > max_bytes:
        raise UnreadableFile(f"larger than {max_bytes:,} bytes ({st.st_size:,} bytes)")
    try:
        with open(p, "rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as err:
        raise UnreadableFile(f"cannot read: {err.strerror or err}") from None
    if len(data) > max_bytes:  # (grown since the stat)
        raise UnreadableFile(f"larger than {max_bytes:,} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise UnreadableFile("not a UTF-8 text file") from None


def _kind(mode: int) -> str:
    """What a non-regular, non-directory file is, in words."""
    for test, name in ((stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "a special file"


class DuplicateKey(ValueError):
    """A JSON object gives a key twice (the key is the message)."""


def no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` refusing a key given twice in one JSON object (``json.loads``
    would keep the last value without a word).

    >>> import json
    >>> json.loads('{"a": 1, "b": {"c": 2, "c": 3}}', object_pairs_hook=no_duplicate_keys)
    Traceback (most recent call last):
    fabricpilot.textfiles.DuplicateKey: c
    """
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKey(key)
        out[key] = value
    return out


def kind_of(data: object) -> str:
    """What a file's parsed top level is, for a message saying it is not what was
    expected: ``"an empty file"`` (nothing in it), else its type with its article.

    >>> kind_of(None), kind_of([1]), kind_of(3)
    ('an empty file', 'a list', 'an int')
    """
    if data is None:
        return "an empty file"
    name = type(data).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def _umask() -> int:
    """The process's file-mode mask (read by setting it back at once)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def written_whole(path: str | Path, mode: str = "w", **open_kw: Any) -> Iterator[IO[Any]]:
    """Open ``path`` for writing (``mode`` ``"w"`` or ``"wb"``, ``open_kw`` as for
    :func:`open`) so that it is replaced only once all is written: the data goes to a
    temporary file beside it, renamed over ``path`` when the block ends without an error
    (the new file takes the mode a new file gets). On an error the temporary file is
    removed, ``path`` is as it was, and an ``OSError`` names ``path``. A symbolic link is
    written through (the file it names is replaced); a path that is not a regular file
    (``/dev/null``, a named pipe) is written to directly.

    >>> import tempfile
    >>> out = Path(tempfile.mkdtemp()) / "summary.json"
    >>> _ = out.write_text("good")
    >>> with written_whole(out) as fh:
    ...     _ = fh.write("half")
    ...     raise OSError(28, "No space left on device")
    Traceback (most recent call last):
    ...
    OSError: [Errno 28] No space left on device: '...summary.json'
    >>> out.read_text(), sorted(p.name for p in out.parent.iterdir())
    ('good', ['summary.json'])
    >>> with written_whole(out) as fh:
    ...     _ = fh.write("new")
    >>> out.read_text()
    'new'
    """
    target = Path(os.path.realpath(path))
    with _said_of(path):
        try:
            special = not stat.S_ISREG(os.stat(target).st_mode)
        except FileNotFoundError:
            special = False
    if special:
        with _said_of(path), open(target, mode, **open_kw) as fh:
            yield fh
        return
    with _said_of(path):  # (a folder missing or read-only: said of the file)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part",
                                   dir=target.parent)
    try:
        with os.fdopen(fd, mode, **open_kw) as fh:
            yield fh
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, target)
    except BaseException as err:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(err, OSError) and (err.filename is None or err.filename == tmp):
            err.filename = str(path)
        raise


@contextlib.contextmanager
def _said_of(path: str | Path) -> Iterator[None]:
    """An ``OSError`` raised in the block names ``path`` (the path a user gave, not the
    file it resolves to)."""
    try:
        yield
    except OSError as err:
        err.filename = str(path)
        raise
