"""The README's TUI picture (docs/images/tui-rank6.svg) tells the truth about
today's code: every frame of ours it shows is a line of the function it names,
and the picture scripts/readme_screenshot.py makes from a real run names the same
frames as the committed one. When either fails, run the script and commit its
picture."""
import ast
import html
import os
import re
import subprocess
import sys
from functools import cache

import pytest

from helpers.run import REPO

PICTURE = os.path.join(REPO, "docs", "images", "tui-rank6.svg")
SCRIPT = os.path.join(REPO, "scripts", "readme_screenshot.py")
README = os.path.join(REPO, "README.md")
PACKAGES = ("engine", "kernels", "diagnose", "tui")
FRAME = re.compile(r"([\w./-]+\.py):(\d+) ([\w<>]+)")
TEXT = re.compile(r'<text [^>]*clip-path="url\(#[\w-]*-line-(\d+)\)">(.*?)</text>')


def screen_lines(svg: str) -> list[str]:
    """The picture's text, one string a terminal line (Rich's SVG clips each line)."""
    lines: dict[int, str] = {}
    for number, text in TEXT.findall(svg):
        lines[int(number)] = lines.get(int(number), "") + html.unescape(text).replace("\xa0", " ")
    return [lines[number] for number in sorted(lines)]


def verdict_frame(svg: str) -> str:
    """The frame the culprit's verdict names: `... at FILE:LINE FUNCTION; ...`."""
    [line] = [line for line in screen_lines(svg) if "never reached execute_model" in line][:1]
    return FRAME.search(line.split(" at ", 1)[1]).group(0)


def stack_frames(svg: str) -> list[str]:
    """The frames of ours above the command's output pane (the verdict line and the
    stack pane), innermost first. The output pane is left out: what the job printed
    last, and so which lines it still shows, differs from run to run."""
    lines = screen_lines(svg)
    [output_pane] = [n for n, line in enumerate(lines) if "─ command output (" in line]
    return [match.group(0) for line in lines[:output_pane] for match in FRAME.finditer(line)
            if is_ours(match.group(1))]


@cache
def our_dirs() -> frozenset[str]:
    return frozenset(os.path.basename(folder) for package in PACKAGES
                     for folder, _, _ in os.walk(os.path.join(REPO, package))) - {"__pycache__"}


def is_ours(shown: str) -> bool:
    """The TUI shows a frame's file by its last two path parts: ours starts with a
    directory of our packages."""
    return shown.split("/")[0] in our_dirs()


def source_of(shown: str) -> str:
    [path] = [os.path.join(folder, name) for package in PACKAGES
              for folder, _, names in os.walk(os.path.join(REPO, package)) for name in names
              if os.path.join(folder, name).endswith("/" + shown)] or [None]
    assert path, f"{shown}: no such file in {', '.join(PACKAGES)}"
    return path


def function_at(path: str, line: int) -> set[str]:
    """The names of the functions (lambdas as <lambda>) whose body holds `line`."""
    with open(path) as source:
        tree = ast.parse(source.read())
    return {getattr(node, "name", "<lambda>") for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            and node.lineno <= line <= node.end_lineno}


def picture() -> str:
    with open(PICTURE) as source:
        return source.read()


@pytest.mark.unit
def test_every_frame_of_ours_in_the_picture_is_a_line_of_the_function_it_names():
    frames = stack_frames(picture())
    assert verdict_frame(picture()) in frames and len(frames) >= 5, frames
    for frame in frames:
        shown, line, function = FRAME.fullmatch(frame).groups()
        found = function_at(source_of(shown), int(line))
        assert function in found, f"{frame}: line {line} is in {found or 'no function'} now"


@pytest.mark.unit
def test_the_readme_quotes_the_verdict_the_picture_shows():
    with open(README) as source:
        text = source.read()
    quoted = text[text.index("[never_reached] rank 6"):].split("```")[0]
    assert FRAME.search(quoted).group(0) == verdict_frame(picture())


@pytest.mark.e2e
def test_the_script_makes_the_picture_of_a_real_run_with_the_same_frames(tmp_path):
    out = tmp_path / "tui-rank6.svg"
    done = subprocess.run([sys.executable, SCRIPT, "--out", str(out)], capture_output=True,
                          text=True, timeout=900, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    made = out.read_text()
    assert "rank 6  CULPRIT" in "\n".join(screen_lines(made))
    assert verdict_frame(made) == verdict_frame(picture())
    assert stack_frames(made) == stack_frames(picture())
