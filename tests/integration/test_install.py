"""libconverger-client as a user gets it: `cmake --install` into a temporary
prefix, the README's example and examples/chat.c compiled with nothing but
`pkg-config --cflags --libs converger` (no rpath or LD_LIBRARY_PATH of the
test's own: the .pc's flags give the programs a RUNPATH), and run against a
real node: they print the history in order, send, and see their own
message come back; without arguments they print their usage."""

import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import NodeCase, mint_token  # noqa: E402

SOURCE_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Install(NodeCase):
    def setUp(self):
        self.build_dir = os.path.dirname(harness.binary())
        self.prefix = tempfile.mkdtemp(prefix="converger-install-")
        self.addCleanup(shutil.rmtree, self.prefix, True)

    def sanitizer_flags(self):
        with open(os.path.join(self.build_dir, "CMakeCache.txt")) as f:
            on = re.search(r"^CONVERGER_SANITIZE:BOOL=ON$", f.read(), re.M)
        # a library built with ASan needs its runtime in the program too
        return ["-fsanitize=address,undefined"] if on else []

    def test_pkg_config_build_of_the_example(self):
        p = subprocess.run(["cmake", "--install", self.build_dir, "--prefix", self.prefix],
                           capture_output=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        pcs = [os.path.join(d, f) for d, _, fs in os.walk(self.prefix) for f in fs if f == "converger.pc"]
        self.assertEqual(len(pcs), 1, pcs)
        self.assertTrue(os.path.exists(os.path.join(self.prefix, "include", "converger", "client.h")))
        env = dict(os.environ, PKG_CONFIG_PATH=os.path.dirname(pcs[0]))
        p = subprocess.run(["pkg-config", "--cflags", "--libs", "converger"], env=env,
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, 0, p.stderr)
        flags = p.stdout.split()
        libdir = [f[2:] for f in flags if f.startswith("-L")][0]
        self.assertTrue(os.path.exists(os.path.join(libdir, "libconverger-client.so")))
        self.assertTrue(os.path.exists(os.path.join(libdir, "libconverger-client.a")))
        # only cvg_ symbols are exported
        nm = subprocess.run(["nm", "-D", "--defined-only", os.path.join(libdir, "libconverger-client.so")],
                            capture_output=True, text=True, timeout=30)
        names = [l.split()[-1].split("@")[0] for l in nm.stdout.splitlines() if l.split()]
        self.assertTrue(names)
        self.assertEqual([n for n in names if not n.startswith("cvg_") and n != "CONVERGER_CLIENT_0"], [])

        exe = os.path.join(self.prefix, "chat")
        p = subprocess.run(["cc", "-std=gnu17", "-Wall", "-Werror", os.path.join(SOURCE_DIR, "examples", "chat.c"),
                            "-o", exe] + self.sanitizer_flags() + flags,
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)

        # found through its RUNPATH, with no LD_LIBRARY_PATH in the environment
        dyn = subprocess.run(["readelf", "-d", exe], capture_output=True, text=True, timeout=30).stdout
        self.assertRegex(dyn, r"\(RUNPATH\).*\[%s\]" % re.escape(libdir), dyn)
        self.env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}

        n = self.node_start()
        conv = n.new_conv()
        n.send(conv, {"text": "first"}, sender="ann")
        n.send(conv, {"text": "second"}, sender="bob")
        p = subprocess.run([exe, n.ws_url, mint_token("me", [conv]), conv],  # TEXT: "hello" by default
                           capture_output=True, text=True, timeout=30, env=self.env)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        lines = p.stdout.splitlines()
        self.assertIn("sent as seq 3", p.stdout)
        printed = [l for l in lines if l.startswith(conv + " #")]
        self.assertEqual(printed, [conv + ' #1 ann: {"text":"first"}',
                                   conv + ' #2 bob: {"text":"second"}',
                                   conv + ' #3 me: {"text":"hello"}'])
        self.assertIn("[connected]", p.stderr)
        p = subprocess.run([exe], capture_output=True, text=True, timeout=10, env=self.env)
        self.assertEqual(p.returncode, 2)
        self.assertIn("usage:", p.stderr)
        self.assertIn("WS_URL TOKEN CONV [TEXT]", p.stderr)

        # The README's program: the first C block of README.md.
        with open(os.path.join(SOURCE_DIR, "README.md")) as f:
            block = re.search(r"```c\n(.*?)```", f.read(), re.S).group(1)
        src = os.path.join(self.prefix, "readme.c")
        with open(src, "w") as f:
            f.write(block)
        readme_exe = os.path.join(self.prefix, "readme")
        p = subprocess.run(["cc", "-std=gnu17", "-Wall", "-Werror", src, "-o", readme_exe]
                           + self.sanitizer_flags() + flags,
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        p = subprocess.run([readme_exe], capture_output=True, text=True, timeout=10, env=self.env)
        self.assertEqual((p.returncode, p.stderr.startswith("usage: ")), (2, True), p.stderr)
        proc = subprocess.Popen([readme_exe, n.ws_url, mint_token("me", [conv]), conv],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env)
        try:
            out, err = proc.communicate(timeout=3)  # it runs until stopped
        except subprocess.TimeoutExpired:
            proc.kill()  # by its pid
            out, err = proc.communicate()
        self.assertIn(conv + ' #1 ann: {"text":"first"}', out, err)
        self.assertIn(conv + ' #4 me: {"text":"hello"}', out, err)
        self.assertIn("sent: seq 4", out, err)


    def test_make_run_builds_what_cmake_install_installs(self):
        """`make run` then `cmake --install build` (the README's order): the
        targets make run builds include every target the install copies."""
        with open(os.path.join(SOURCE_DIR, "CMakeLists.txt")) as f:
            installed = set()
            for m in re.finditer(r"install\(TARGETS ([^)]*?)\s+(?:LIBRARY|ARCHIVE|RUNTIME|DESTINATION)", f.read()):
                installed.update(m.group(1).split())
        self.assertIn("converger_client", installed)
        p = subprocess.run(["make", "-n", "run"], cwd=SOURCE_DIR, capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 0, p.stderr)
        built = re.search(r"--target ([^-\n]*?) --", p.stdout)
        self.assertIsNotNone(built, p.stdout)
        self.assertEqual(installed - set(built.group(1).split()), set(), p.stdout)


if __name__ == "__main__":
    harness.main()
