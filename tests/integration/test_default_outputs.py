"""What the commands write into the current directory by default is ignored
by git when they run at the top of the work tree, as the README runs them:
the output directories of `converger sim`, `converger bench roll` and
`converger bench compare` (read from their --help, so a renamed default is
checked too), and the data directory of `make run` / `make cluster`."""

import os
import re
import shutil
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class DefaultOutputs(unittest.TestCase):
    def help_text(self, *args):
        r = subprocess.run([harness.binary(), *args, "--help"], capture_output=True, text=True,
                           timeout=10)
        self.assertEqual(r.returncode, 0, r.stderr)
        return r.stdout

    def out_default(self, text, pattern):
        """The default of --out: the first match of pattern at or after the
        line that starts with "  --out"."""
        at = text.index("  --out ")
        m = re.search(pattern, text[at:])
        self.assertIsNotNone(m, "no default for --out in:\n%s" % text)
        return m.group(1)

    def default_dirs(self):
        dirs = [self.out_default(self.help_text("sim"), r"\(default ([\w.-]+)\)"),
                self.out_default(self.help_text("bench", "roll"), r"\[([\w.-]+)\]")]
        compare = self.help_text("bench", "compare")
        pattern = self.out_default(compare, r"\[([\w.-]+)\]")
        presets = re.search(r"--preset ([\w|]+)", compare).group(1).split("|")
        self.assertIn("PRESET", pattern)
        dirs += [pattern.replace("PRESET", p) for p in presets]
        return dirs

    def test_default_output_dirs_are_ignored_by_git(self):
        self.assertIsNotNone(shutil.which("git"), "git not found")
        dirs = self.default_dirs()
        self.assertIn("sim-out", dirs)
        for d in dirs + ["data", "data/cluster"]:
            with self.subTest(dir=d):
                for name in ("summary.json", "sub/timeline.csv"):
                    path = "%s/%s" % (d, name)
                    r = subprocess.run(["git", "-C", ROOT, "check-ignore", "--no-index", "-q", path],
                                       capture_output=True, text=True, timeout=10)
                    self.assertEqual(r.returncode, 0, "%s is not ignored by git (.gitignore)%s"
                                     % (path, (": " + r.stderr) if r.stderr else ""))
                tracked = subprocess.run(["git", "-C", ROOT, "ls-files", "--", d], capture_output=True,
                                         text=True, timeout=10)
                self.assertEqual(tracked.stdout, "", "tracked files under an ignored output directory")


if __name__ == "__main__":
    harness.main()
