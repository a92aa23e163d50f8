"""The parts every export writes with: Markdown that JupyterLab shows as written (code that
its own backticks cannot close, dollar signs that never become maths), the notebook's kernel,
and a file replaced whole or not at all."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

__all__ = ["EXPORT_VERSION", "KERNEL_METADATA", "code", "duration", "escape_dollars", "fence",
           "json_text", "markdown_cell", "nbformat", "text", "value_md", "write_whole"]

EXPORT_VERSION = 1


def nbformat() -> Any:
    """nbformat with its v4 builders, imported when a notebook is made: importing it loads its
    JSON-schema validators (seconds on a small machine), which ``%load_ext durable_nb`` and
    every ``durable-nb`` command would otherwise pay without exporting anything."""
    import nbformat.v4

    return nbformat




#: An exported notebook's kernel: the one ``pip install ipykernel`` registers, as Jupyter
#: writes it, so that JupyterLab, Notebook 7 and nbclient open and run it without asking
#: for a kernel (no version: the reader's kernel fills that in).
KERNEL_METADATA = {
    "kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)",
                   "language": "python"},
    "language_info": {"name": "python", "mimetype": "text/x-python", "file_extension": ".py",
                      "pygments_lexer": "ipython3", "nbconvert_exporter": "python",
                      "codemirror_mode": {"name": "ipython", "version": 3}},
}


def write_whole(path: Path, text: str) -> None:
    # A half-written notebook would not open: write beside it, then rename over it.
    folder = path.parent
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise FileNotFoundError(f"cannot write {path}: the folder {folder} {what}. Create it "
                                f"first, or export to a path in an existing folder.")
    if path.is_dir():
        raise IsADirectoryError(f"cannot write {path}: it is a folder. Name the file to "
                                f"write, e.g. {path / 'run.ipynb'}.")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        raise OSError(f"cannot write {path}: {exc.strerror or exc}. Check that the folder is "
                      f"writable, or export to another path.") from None
    finally:
        tmp.unlink(missing_ok=True)


def value_md(value: Any) -> str:
    return fence(value, "text") if isinstance(value, str) else fence(json_text(value), "json")


def json_text(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


# A fenced code block as fence writes it, or a code span as code writes it: their text is
# shown as it is, so a dollar sign in it stays as it is.
_CODE = re.compile(r"^(`{3,})[^\n]*\n(?s:.*?)\n\1$|(?<!`)(`+)(?!`)[^\n]*?(?<!`)\2(?!`)",
                   re.MULTILINE)


_DOLLAR = "<span>\\$</span>"


def escape_dollars(markdown: str) -> str:
    """``markdown`` with every ``$`` outside code written ``<span>\\$</span>`` (inline HTML
    that JupyterLab 4.6 shows as a dollar sign, measured). JupyterLab renders the text between two dollar
    signs as maths (a cost line and the next became one formula); ``\\$`` alone stops its
    Markdown step from taking it for maths, but MathJax then still pairs two dollar signs of
    one paragraph ("it costs $5, or $7"): it never pairs them across an element."""
    parts, end = [], 0
    for match in _CODE.finditer(markdown):
        parts += [markdown[end:match.start()].replace("$", _DOLLAR), match.group(0)]
        end = match.end()
    parts.append(markdown[end:].replace("$", _DOLLAR))
    return "".join(parts)


def markdown_cell(source: str, **fields: Any) -> Any:
    """A markdown cell of ``source``, its dollar signs escaped (:func:`escape_dollars`)."""
    return nbformat().v4.new_markdown_cell(escape_dollars(source), **fields)


def fence(text: str, lang: str = "") -> str:
    """A fenced code block that the text's own backticks cannot close."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}{lang}\n{text}\n{ticks}"


def text(words: str) -> str:
    """``words`` (outside text: a person's message, edited arguments) as Markdown inline text
    shown as written: the characters Markdown or HTML would take as markup escaped, and its
    line breaks made spaces (a new line could start a heading, a rule or a quote)."""
    one_line = re.sub(r"\s*[\r\n]+\s*", " ", words)
    return re.sub(r"([\\`*_\[\]<>|~&#])", r"\\\1", one_line)


def code(text: Any) -> str:
    text = str(text)
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    ticks = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.1f} ms"
    if seconds < 120:
        return f"{seconds:.2f} s"
    return f"{int(seconds // 60)} min {seconds % 60:.0f} s"
