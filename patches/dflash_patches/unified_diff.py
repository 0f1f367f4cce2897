"""Parse unified diffs and apply them exactly (no fuzz, no offset), forwards or in reverse."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_HUNK_HEADER = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class HunkFailed(Exception):
    """A hunk's context or removed lines are not where the diff says."""

    def __init__(self, path: str, index: int, header: str, detail: str) -> None:
        super().__init__(f"{path}: hunk {index} ({header}) does not apply: {detail}")
        self.path = path
        self.index = index
        self.header = header


@dataclass
class Hunk:
    header: str
    old_start: int
    new_start: int
    lines: list[str] = field(default_factory=list)  # each starts with ' ', '-' or '+'

    def side(self, old: bool) -> list[str]:
        keep = "-" if old else "+"
        return [line[1:] for line in self.lines if line[:1] in (" ", keep)]


@dataclass
class FilePatch:
    path: str
    hunks: list[Hunk] = field(default_factory=list)

    def apply(self, text: str, *, reverse: bool = False) -> str:
        """Apply every hunk to `text`; raise HunkFailed naming the first that does not fit."""
        lines = text.splitlines(keepends=True)
        out: list[str] = []
        cursor = 0
        for index, hunk in enumerate(self.hunks, start=1):
            expected = hunk.side(old=not reverse)
            replacement = hunk.side(old=reverse)
            start = (hunk.new_start if reverse else hunk.old_start) - 1
            if not expected:  # pure insertion: the header names the line before it
                start += 1
            if start < cursor or start + len(expected) > len(lines):
                raise HunkFailed(
                    self.path, index, hunk.header, f"the file has only {len(lines)} lines"
                )
            for offset, want in enumerate(expected):
                got = lines[start + offset].rstrip("\n")
                if got != want.rstrip("\n"):
                    raise HunkFailed(
                        self.path,
                        index,
                        hunk.header,
                        f"line {start + offset + 1} is {got!r}, expected {want.rstrip()!r}",
                    )
            out.extend(lines[cursor:start])
            out.extend(line if line.endswith("\n") else line + "\n" for line in replacement)
            cursor = start + len(expected)
        out.extend(lines[cursor:])
        return "".join(out)


def parse(diff_text: str) -> list[FilePatch]:
    """Files and hunks of a (git-style) unified diff; text before the first file is skipped."""
    files: list[FilePatch] = []
    current: FilePatch | None = None
    hunk: Hunk | None = None
    remaining_old = remaining_new = 0
    for line in diff_text.splitlines():
        if hunk is not None and (remaining_old > 0 or remaining_new > 0):
            tag = line[:1] if line else " "
            if tag not in (" ", "-", "+", "\\"):
                raise ValueError(f"malformed hunk line in {current and current.path}: {line!r}")
            if tag == "\\":  # "\ No newline at end of file"
                continue
            hunk.lines.append(line if line else " ")
            remaining_old -= tag in (" ", "-")
            remaining_new -= tag in (" ", "+")
            continue
        if line.startswith("+++ "):
            path = line[4:].split("\t")[0]
            current = FilePatch(path=path[2:] if path.startswith("b/") else path)
            files.append(current)
            hunk = None
        elif line.startswith("@@ ") and current is not None:
            match = _HUNK_HEADER.match(line)
            if match is None:
                raise ValueError(f"malformed hunk header in {current.path}: {line!r}")
            old_start, old_len, new_start, new_len = match.groups()
            hunk = Hunk(
                header=line.split(" @@")[0] + " @@",
                old_start=int(old_start),
                new_start=int(new_start),
            )
            current.hunks.append(hunk)
            remaining_old = int(old_len) if old_len is not None else 1
            remaining_new = int(new_len) if new_len is not None else 1
    return files
