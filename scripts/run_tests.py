#!/usr/bin/env python3
"""Runs the workspace's test binaries, a few at a time, and the doc tests.

`scripts/test` builds every test binary with `cargo test --no-run --message-format=json`
and gives cargo's messages here. Each binary runs as `cargo test` would run it (from its
package's directory, with `CARGO_MANIFEST_DIR`, `CARGO_PKG_NAME` and `LD_LIBRARY_PATH` set, all of its tests,
the test harness's own threads), its output kept in a log; the doc tests run as one more job
(`cargo test --doc`). Most binaries spend their time waiting on the servers they start (a
failover, a lease running out, a fault profile), so `TEST_JOBS` of them (default 3) run side
by side, the longest first. A binary's `test result:` line is printed when it finishes, its
whole log when it fails; the exit status is 1 if anything failed.

    cargo test --workspace --all-features --no-run --message-format=json-render-diagnostics > artifacts
    python3 scripts/run_tests.py --workspace --all-features < artifacts
    # the arguments after the script's name go to `cargo test --doc`
"""

import functools
import json
import os
import subprocess
import sys
import tempfile
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor, as_completed

# The binaries that take longest on a 2-core machine (tens of seconds each, most of it
# waiting), started first so that they do not finish last; the rest follow by name.
LONGEST = [
    "soak",
    "jepsen_elections",
    "jepsen_redis_sentinel",
    "redis_sentinel",
    "doc tests",
    "etcd_tls",
    "ui",
    "etcd_rbac",
    "etcd_ensemble",
    "zookeeper_ensemble",
    "jepsen_zookeeper",
    "postgres_tls",
    "scheduled",
    "jepsen_redlock",
    "jepsen_etcd",
    "etcd",
    "jepsen_mysql",
    "mysql",
]


@functools.cache
def package_name(manifest_path):
    with open(manifest_path, "rb") as f:
        return tomllib.load(f)["package"]["name"]


def test_binaries(messages):
    """(name, executable, manifest path) of every test binary cargo built."""
    seen = set()
    binaries = []
    for line in messages:
        if not line.startswith("{"):
            continue
        message = json.loads(line)
        if message.get("reason") != "compiler-artifact" or not message.get("executable"):
            continue
        if not message.get("profile", {}).get("test"):
            continue
        exe = message["executable"]
        if exe in seen:
            continue
        seen.add(exe)
        target = message["target"]
        name = target["name"]
        if any(kind in target["kind"] for kind in ("lib", "bin", "proc-macro")):
            name = f"{name} (unit tests)"
        binaries.append((name, exe, message["manifest_path"]))
    return binaries


def run(job, logs):
    name, argv, cwd, env = job
    log_path = os.path.join(logs, name.replace(" ", "_").replace("/", "_") + ".log")
    started = time.monotonic()
    with open(log_path, "w") as log:
        code = subprocess.call(argv, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    with open(log_path, errors="replace") as log:
        output = log.read()
    return name, code, time.monotonic() - started, output


def order(name):
    base = name.removesuffix(" (unit tests)")
    return (LONGEST.index(base), "") if base in LONGEST else (len(LONGEST), name)


def library_path(exe):
    """`LD_LIBRARY_PATH` as cargo sets it for a test: the binary's own directory and the
    toolchain's libraries (a proc-macro crate's tests link the standard library dynamically)."""
    sysroot = subprocess.run(["rustc", "--print", "sysroot"], capture_output=True, text=True, check=True).stdout.strip()
    host = next(
        line.split(":", 1)[1].strip()
        for line in subprocess.run(["rustc", "-vV"], capture_output=True, text=True, check=True).stdout.splitlines()
        if line.startswith("host:")
    )
    paths = [os.path.dirname(exe), os.path.join(sysroot, "lib", "rustlib", host, "lib"), os.path.join(sysroot, "lib")]
    if os.environ.get("LD_LIBRARY_PATH"):
        paths.append(os.environ["LD_LIBRARY_PATH"])
    return os.pathsep.join(paths)


def main():
    doc_args = sys.argv[1:]
    binaries = test_binaries(sys.stdin)
    if not binaries:
        print("run_tests: cargo built no test binary", file=sys.stderr)
        return 1
    jobs = []
    libraries = library_path(binaries[0][1])
    for name, exe, manifest in binaries:
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = libraries
        env["CARGO_MANIFEST_DIR"] = os.path.dirname(manifest)
        env["CARGO_PKG_NAME"] = package_name(manifest)
        jobs.append((name, [exe], os.path.dirname(manifest), env))
    jobs.append(("doc tests", ["cargo", "test", "--doc", *doc_args], os.getcwd(), dict(os.environ)))
    jobs.sort(key=lambda job: order(job[0]))
    parallel = int(os.environ.get("TEST_JOBS", "3"))
    failed = []
    # Each failure's panic messages, printed again last: a log cut in the middle still says why.
    why = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as logs, ThreadPoolExecutor(max_workers=parallel) as pool:
        # Figures the tests measured (`lock_tests::figure`), printed at the end.
        figures = os.path.join(logs, "figures")
        for job in jobs:
            job[3]["LOCK_TEST_FIGURES"] = figures
        running = [pool.submit(run, job, logs) for job in jobs]
        for done in as_completed(running):
            name, code, took, output = done.result()
            results = [line for line in output.splitlines() if line.startswith("test result:")]
            if code == 0:
                for line in results or ["(no tests)"]:
                    print(f"{name} ({took:.1f}s): {line}", flush=True)
            else:
                failed.append(name)
                print(f"\n==================== {name} FAILED (exit {code}, {took:.1f}s) ====================")
                print(output, flush=True)
                why.append((name, panics(output)))
        if os.path.exists(figures):
            with open(figures, errors="replace") as f:
                print("\nFigures measured by the tests:\n" + f.read(), end="", flush=True)
    print(f"\n{len(jobs)} test jobs in {time.monotonic() - started:.0f}s, {parallel} at a time")
    for name, lines in why:
        print(f"\n{name}: why it failed")
        print("\n".join(lines) or "(no panic message: see its log above)", flush=True)
    if failed:
        print("FAILED: " + ", ".join(failed))
        return 1
    return 0


def panics(output):
    """The lines of each `panicked at` and the message that follows it (up to 6 lines), at most 40."""
    lines, out = output.splitlines(), []
    for i, line in enumerate(lines):
        if "panicked at" in line:
            for text in lines[i : i + 7]:
                if text.startswith("stack backtrace:") or text.startswith("note: "):
                    break
                out.append("  " + text[:400])
    return out[:40]


if __name__ == "__main__":
    sys.exit(main())
