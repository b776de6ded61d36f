"""Write a compile's output directory without ever touching files hetpart did not write.

An output directory is recognised as hetpart's by its index, ``hetpart-output.json``, which lists every file
hetpart wrote there. Rules:

- a path that does not exist, or an empty directory, is written;
- a directory holding hetpart's index is replaced only with ``overwrite=True`` (``--force``), and only when it holds
  nothing but the files its index lists: a user's file put there later is never deleted;
- anything else (a file, a symlink, a non-empty directory without the index) is refused.

The new output is written into a temporary sibling directory and renamed into place, so an interrupted compile
leaves the earlier output as it was.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from hetpart.errors import OutputDirError

log = logging.getLogger(__name__)

INDEX_NAME = "hetpart-output.json"
INDEX_KIND = "hetpart compile output"


def _files_under(directory: Path) -> list[str]:
    """Every file and symlink below ``directory`` as a sorted POSIX path relative to it (empty dirs ignored)."""
    found = []
    for root, dirs, files in os.walk(directory):
        base = Path(root)
        found.extend((base / name).relative_to(directory).as_posix() for name in files)
        found.extend((base / name).relative_to(directory).as_posix() for name in dirs
                     if (base / name).is_symlink())
    return sorted(found)


def read_index(directory: Path) -> list[str] | None:
    """The files hetpart's index in ``directory`` lists, or None when ``directory`` holds no readable index."""
    index = directory / INDEX_NAME
    if not index.is_file() or index.is_symlink():
        return None
    try:
        data = json.loads(index.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("kind") != INDEX_KIND or not isinstance(data.get("files"), list):
        return None
    return [str(f) for f in data["files"]]


def check_writable(target: str | Path, *, overwrite: bool = False) -> Path:
    """Raise :class:`OutputDirError` unless ``target`` may be (re)written under the rules above; returns it resolved.

    Called before a compile starts, so a refused path costs the user no waiting."""
    path = Path(target).absolute()
    if path.is_symlink():
        raise OutputDirError(f"output path {path} is a symlink; hetpart writes a new directory and never replaces "
                             "links. Choose a new directory name")
    if not path.exists():
        if path.parent.exists() and not path.parent.is_dir():
            raise OutputDirError(f"output path {path}: its parent {path.parent} is a file, not a directory")
        return path
    if not path.is_dir():
        raise OutputDirError(f"output path {path} is an existing file; hetpart writes a directory there and never "
                             "replaces a file. Choose a new directory name (e.g. -o hetpart-out/NAME)")
    present = _files_under(path)
    if not present and not any(path.iterdir()):
        return path
    listed = read_index(path)
    if listed is None:
        raise OutputDirError(f"output directory {path} is not empty and is not a hetpart output (it has no "
                             f"{INDEX_NAME}); hetpart never writes into or deletes a directory it did not create. "
                             "Choose a new or empty directory")
    if not overwrite:
        raise OutputDirError(f"output directory {path} holds an earlier hetpart output; pass --force (Python: "
                             "overwrite=True) to replace it, or choose another directory")
    foreign = sorted(set(present) - set(listed) - {INDEX_NAME})
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise OutputDirError(f"output directory {path} holds an earlier hetpart output plus files hetpart did not "
                             f"write ({shown}); --force replaces only hetpart's own files: move those out or choose "
                             "another directory")
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_directory(target: str | Path, write: Callable[[Path], None], *, overwrite: bool = False) -> Path:
    """Create the output directory ``target`` by calling ``write(staging_dir)``, then swap it into place.

    ``write`` fills a fresh temporary sibling of ``target``; hetpart's index is added listing what it wrote. The
    sibling is renamed to ``target`` (an earlier hetpart output there is moved aside first and deleted only after the
    rename succeeded). On any error the staging directory is removed and ``target`` is left as it was."""
    path = check_writable(target, overwrite=overwrite)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.hetpart-new-", dir=path.parent))
    backup: Path | None = None
    try:
        staging.chmod(0o777 & ~_umask())    # mkdtemp creates 0700; an output directory gets the user's umask
        write(staging)
        files = _files_under(staging)
        (staging / INDEX_NAME).write_text(json.dumps({"kind": INDEX_KIND, "files": files}, indent=1))
        check_writable(path, overwrite=overwrite)      # again: the directory may have changed while compiling
        if path.exists():
            if any(path.iterdir()):
                backup = Path(tempfile.mkdtemp(prefix=f".{path.name}.hetpart-old-", dir=path.parent))
                path.rename(backup / path.name)
            else:
                path.rmdir()
        staging.rename(path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if backup is not None and not path.exists() and (backup / path.name).exists():
            (backup / path.name).rename(path)          # put the earlier output back
            backup.rmdir()
        raise
    if backup is not None:
        shutil.rmtree(backup, ignore_errors=True)   # only hetpart's files: check_writable verified the index
    return path
