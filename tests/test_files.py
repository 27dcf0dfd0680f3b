"""``s2d2.files.write_text_atomically``: whole files or none, the usual permissions, one-line errors."""

from __future__ import annotations

import os

import pytest

from s2d2.errors import S2D2Error
from s2d2.files import write_text_atomically


def test_writes_whole_files_with_a_new_files_mode_or_the_old_ones(tmp_path):
    new = write_text_atomically(tmp_path / "sub" / "a.json", "one\n")
    assert new.read_text(encoding="utf-8") == "one\n"
    umask = os.umask(0)
    os.umask(umask)
    assert new.stat().st_mode & 0o777 == 0o666 & ~umask  # not a temporary file's owner-only 0600
    os.chmod(new, 0o640)
    write_text_atomically(new, "two\n")
    assert new.read_text(encoding="utf-8") == "two\n" and new.stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in new.parent.iterdir()) == ["a.json"]  # no temporary file left


def test_a_failed_write_is_one_line_and_leaves_the_old_file(tmp_path):
    target = tmp_path / "keep.json"
    target.write_text("old", encoding="utf-8")
    with pytest.raises(S2D2Error, match="cannot write") as err:
        write_text_atomically(tmp_path / "keep.json" / "x.json", "new")  # a file where a folder must be
    assert "\n" not in str(err.value)
    with pytest.raises(UnicodeEncodeError):
        write_text_atomically(target, "\ud800")  # text that cannot be written: the old file stays
    assert target.read_text(encoding="utf-8") == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.json"]
