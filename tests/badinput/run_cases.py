#!/usr/bin/python3
"""meshlm's bad-input suite: runs the cases of cases.py.

Each case gets a fresh work directory, filled by the case's setup steps
(gen.py), and runs `mpiexec -n RANKS meshlm ARGS` there (cwd = the work
directory, so every path of a case is relative to it). A case passes when

  * the exit status is the expected one: for rejected input every rank that
    ends by itself ends non-zero (each rank's status is recorded, see
    RANK_WRAPPER, and mpiexec is told not to kill the other ranks when one
    exits non-zero, so each must end on its own); for input meshlm must
    accept, mpiexec and every rank exit 0,
  * the output (stdout and stderr of every rank) matches the case's regex
    (the key or file the message must name), not its `forbid` regex, and is
    no longer than its `max_output`,
  * the command ended within the case's time bound (default 30 s; a rank
    that hangs is killed there and the case fails), and no process of the
    case is left running afterwards,
  * nothing on disk changed: every entry of the work directory (path, kind,
    mode, size, SHA-256 of the content, symlink target; FIFOs are never
    opened) is recorded before and after, and no entry may be created,
    changed or removed, except under the paths the case names in
    `may_change` (the outputs of input that is accepted, a cache that is
    legitimately rewritten).

Cases in cases.PENDING express the correct behaviour of something meshlm
gets wrong today; they are reported as skipped ("pending: <issue item>",
exit status 77, which ctest shows as a skip) and not run, unless
--run-pending is given, which runs them and reports them like any other.

Usage:
  run_cases.py --meshlm build/meshlm                  # every case, summary at the end
  run_cases.py --meshlm build/meshlm --group tokens   # one group
  run_cases.py --meshlm build/meshlm NAME...          # some cases, by name
  run_cases.py --meshlm build/meshlm --run-pending NAME
  run_cases.py --list                                 # name group bound pending, for CMake
  ctest -L badinput                                   # one ctest per case (tests/badinput.cmake)
"""
import argparse
import hashlib
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import cases as case_table  # noqa: E402
import gen  # noqa: E402

SKIP = 77  # ctest SKIP_RETURN_CODE


# ---------------------------------------------------------------------------
# The state of a work directory
# ---------------------------------------------------------------------------

def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def snapshot(root):
    """{relative path: description} of every entry under root, without
    following symlinks and without opening anything but regular files."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            rel = os.path.relpath(p, root)
            st = os.lstat(p)
            mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("symlink", os.readlink(p))
            elif stat.S_ISREG(st.st_mode):
                out[rel] = ("file", oct(mode), st.st_size, sha256_of(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", oct(mode))
            elif stat.S_ISFIFO(st.st_mode):
                out[rel] = ("fifo", oct(mode))
            else:
                out[rel] = ("other", oct(st.st_mode))
    return out


def allowed(rel, prefixes):
    return any(rel == p or rel.startswith(p.rstrip("/") + "/") for p in prefixes)


def diff(before, after, may_change):
    """Lines describing every entry created, removed or changed outside
    `may_change`."""
    lines = []
    for rel in sorted(set(before) | set(after)):
        if allowed(rel, may_change):
            continue
        b, a = before.get(rel), after.get(rel)
        if b == a:
            continue
        if b is None:
            lines.append("created: %s %s" % (rel, a))
        elif a is None:
            lines.append("removed: %s %s" % (rel, b))
        else:
            lines.append("changed: %s %s -> %s" % (rel, b, a))
    return lines


# ---------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------

def processes_in(work):
    """PIDs of processes whose working directory is `work` or below it: the
    ranks of a case (mpiexec starts them in its own cwd)."""
    work = os.path.realpath(work)
    me = os.getpid()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            cwd = os.readlink("/proc/%s/cwd" % entry)
        except OSError:
            continue
        if cwd == work or cwd.startswith(work + "/"):
            pids.append(int(entry))
    return pids


def kill_case(procs, work):
    """Ends what one case started: the process groups of its mpiexec
    commands, then any process still working in its directory, by pid."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    for pid in processes_in(work):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


# Each rank runs as `sh -c '"$@"; echo $? > STATUS.<rank>' meshlm-rank meshlm ARGS`,
# so that the exit status of every rank is known, and mpiexec is told not to
# kill the job when a rank exits non-zero (Open MPI's
# orte_abort_on_non_zero_status = 0): a rank that fails while another hangs
# then shows as the hang it is, instead of being killed by mpiexec and
# passing. (MPI_Abort still ends the whole job, as it should.)
RANK_WRAPPER = ('"$@"; s=$?; echo $s > "$MESHLM_BADINPUT_STATUS.'
                '${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-${PMIX_RANK:-x}}}"; exit $s')


class Launch:
    """One mpiexec command of a case, started now."""

    def __init__(self, runner, cwd, ranks, args, log, status_prefix):
        self.ranks, self.status_prefix, self.log = ranks, str(status_prefix), log
        for old in Path(self.status_prefix).parent.glob(Path(self.status_prefix).name + ".*"):
            old.unlink()
        env = dict(runner.env, MESHLM_BADINPUT_STATUS=self.status_prefix)
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(runner.command(ranks, args, wrapped=True), cwd=cwd,
                                         stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         env=env)

    def rank_statuses(self):
        """{rank: exit status} of the ranks that ended by themselves (a rank
        killed by MPI_Abort or by the timeout has none)."""
        out = {}
        for f in Path(self.status_prefix).parent.glob(Path(self.status_prefix).name + ".*"):
            try:
                out[f.name.rsplit(".", 1)[1]] = int(f.read_text().strip())
            except (ValueError, OSError):
                pass
        return out

    def status(self):
        """0 when mpiexec and every rank exited 0; else mpiexec's status, or
        the first non-zero rank status, or -1 (a rank ended without one)."""
        rc = self.proc.returncode
        ranks = self.rank_statuses()
        if rc != 0:
            return rc
        for r in sorted(ranks):
            if ranks[r] != 0:
                return ranks[r]
        if len(ranks) < self.ranks:
            return -1
        return 0

    def describe(self):
        ranks = self.rank_statuses()
        return "mpiexec %s, ranks %s" % (
            self.proc.returncode,
            " ".join("%s:%s" % (r, ranks.get(str(r), "-")) for r in range(self.ranks)))


class Runner:
    def __init__(self, args):
        self.meshlm = os.path.realpath(args.meshlm) if args.meshlm else None
        self.mpiexec = args.mpiexec or shutil.which("mpiexec") or "mpiexec"
        self.numproc_flag = args.numproc_flag
        version = self.mpiexec_version()
        self.openmpi = "Open MPI" in version or "OpenRTE" in version
        if args.preflags is not None:
            self.preflags = shlex.split(args.preflags)
        else:
            self.preflags = ["--allow-run-as-root", "--oversubscribe"] if self.openmpi else []
        self.scratch = Path(args.scratch).resolve()
        self.fixtures = Path(args.fixtures).resolve() if args.fixtures else self.scratch / "fixtures"
        self.keep = args.keep
        self.env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")

    def mpiexec_version(self):
        try:
            return subprocess.run([self.mpiexec, "--version"], capture_output=True, text=True,
                                  timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired):
            return ""

    def command(self, ranks, args, wrapped=False):
        """The mpiexec command line; `wrapped`: each rank records its exit
        status (RANK_WRAPPER)."""
        cmd = [self.mpiexec, self.numproc_flag, str(ranks)] + self.preflags
        if wrapped:
            if self.openmpi:
                cmd += ["--mca", "orte_abort_on_non_zero_status", "0"]
            cmd += ["/bin/sh", "-c", RANK_WRAPPER, "meshlm-rank"]
        return cmd + [self.meshlm] + list(args)

    def run(self, cwd, ranks, args, timeout, log):
        """Runs one meshlm command to the end; returns its status (None: it
        did not end within `timeout` seconds and was killed)."""
        launch = Launch(self, cwd, ranks, args, log, Path(log).with_suffix(".status"))
        try:
            launch.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_case([launch.proc], cwd)
            return None
        return launch.status()

    # ---- fixtures ------------------------------------------------------------

    def make_fixtures(self):
        """The valid files the cases start from, made once per run of the
        suite: tokens.h5 by `meshlm tokenize`, cache-nf4.h5 by `meshlm
        quantize` (tiny model, LoRA, NF4, base = GPT-2 initialisation from
        train.seed 1337), base.safetensors and base.h5 (the tiny model)."""
        tmp = self.fixtures.with_name(self.fixtures.name + ".tmp.%d" % os.getpid())
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        text = Path("/usr/share/common-licenses/GPL-3")
        if not text.is_file():
            text = tmp / "corpus.txt"
            text.write_bytes(gen.gpl_ids(40000).astype("u1").tobytes())
        steps = [
            (1, ["tokenize", str(text), "tokens.h5"]),
            (1, ["quantize", "run.cfg", "--finetune.mode=lora", "--quant.type=nf4",
                 "--quant.cache=cache-nf4.h5"]),
        ]
        gen.write(tmp, "run.cfg", gen.config_text())
        for ranks, args in steps:
            rc = self.run(tmp, ranks, args, 120, tmp / "fixture.log")
            if rc != 0:
                sys.stdout.write((tmp / "fixture.log").read_text(errors="replace"))
                raise SystemExit("fixtures: `meshlm %s` failed (status %s)" % (" ".join(args), rc))
        gen.safetensors("base.safetensors")(tmp, tmp)
        gen.params_h5("base.h5")(tmp, tmp)
        for f in tmp.glob("fixture.*"):
            f.unlink()
        shutil.rmtree(self.fixtures, ignore_errors=True)
        os.replace(tmp, self.fixtures)
        print("fixtures written to %s" % self.fixtures)

    def have_fixtures(self):
        return all((self.fixtures / n).is_file()
                   for n in ("tokens.h5", "cache-nf4.h5", "base.safetensors", "base.h5"))

    # ---- one case ------------------------------------------------------------

    def run_case(self, case, run_pending=False):
        """Returns ("pass" | "fail" | "pending", seconds)."""
        reason = case_table.PENDING.get(case.name)
        if reason is not None and not run_pending:
            print("SKIPPED %s: pending: %s" % (case.name, reason))
            print("  (run it with: %s --meshlm MESHLM --run-pending %s)" % (sys.argv[0], case.name))
            return "pending", 0.0

        home = self.scratch / "cases" / case.name
        work = home / "work"
        shutil.rmtree(home, ignore_errors=True)
        work.mkdir(parents=True)
        try:
            for step in case.setup:
                step(work, self.fixtures)
        except Exception as e:  # a broken case is a failing case, not a crashed suite
            import traceback
            traceback.print_exc()
            print("FAIL %s: its setup raised %r" % (case.name, e))
            return "fail", 0.0
        for ranks, args in case.before:  # commands whose results the case starts from
            rc = self.run(work, ranks, args, 120, home / "before.log")
            if rc != 0:
                print((home / "before.log").read_text(errors="replace"))
                print("FAIL %s: setup command `meshlm %s` failed (status %s)"
                      % (case.name, " ".join(args), rc))
                return "fail", 0.0
        before = snapshot(work)

        print("case %s (%s): %s" % (case.name, case.group, case.doc))
        print("  cd %s && %s" % (work, shlex.join(self.command(case.ranks, case.args))))
        print("  (each rank wrapped to record its exit status; see RANK_WRAPPER)")
        launches = []
        t0 = time.monotonic()
        for i in range(case.concurrent):
            tag = "" if case.concurrent == 1 else ".%d" % i
            launches.append(Launch(self, work, case.ranks, case.args, home / ("output%s.log" % tag),
                                   home / ("status%s" % tag)))
        procs = [l.proc for l in launches]
        timed_out = False
        for p in procs:
            left = case.timeout - (time.monotonic() - t0)
            try:
                p.wait(timeout=max(left, 0.01))
            except subprocess.TimeoutExpired:
                timed_out = True
                break
        if timed_out:
            kill_case(procs, work)
        seconds = time.monotonic() - t0
        statuses = [l.status() for l in launches]
        # Every rank must have ended with mpiexec.
        stragglers = []
        deadline = time.monotonic() + 3
        while True:
            stragglers = processes_in(work)
            if not stragglers or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        if stragglers:
            kill_case([], work)
        after = snapshot(work)
        outputs = [l.log.read_text(errors="replace") for l in launches]

        problems = []
        for i, text in enumerate(outputs):
            if case.concurrent > 1:
                print("---- output of run %d" % i)
            tail = text if len(text) < 6000 else text[:3000] + "\n...\n" + text[-3000:]
            print(tail.rstrip())
        print("---- exit status %s, %.2f s (bound %g s)"
              % ("; ".join(l.describe() for l in launches), seconds, case.timeout))
        if timed_out:
            problems.append("did not end within %g s (a rank hangs); killed" % case.timeout)
        if stragglers:
            problems.append("processes still running after mpiexec ended: %s" % stragglers)
        if not timed_out:
            if case.expect == "fail":
                if statuses[0] == 0:
                    problems.append("exit status 0; expected the input to be rejected")
                elif 0 in launches[0].rank_statuses().values():
                    problems.append("a rank exited 0 while the input was rejected (%s); every rank "
                                    "must exit non-zero" % launches[0].describe())
            elif case.expect == "ok":
                if statuses[0] != 0:
                    problems.append("exit status %s; expected the input to be accepted" % statuses[0])
            elif case.expect == "one_ok":
                if sorted(s == 0 for s in statuses) != [False] * (len(statuses) - 1) + [True]:
                    problems.append("exit statuses %s; expected exactly one run to succeed" % statuses)
        combined = "\n".join(outputs)
        if case.regex and not timed_out:
            if case.expect == "one_ok":
                failed = [o for o, s in zip(outputs, statuses) if s != 0]
                if not any(re.search(case.regex, o) for o in failed):
                    problems.append("no failing run's output matches: %s" % case.regex)
            elif not re.search(case.regex, combined):
                problems.append("output does not match: %s" % case.regex)
        if case.max_output is not None:
            for l in launches:
                size = l.log.stat().st_size
                if size > case.max_output:
                    problems.append("%d bytes of output (at most %d)" % (size, case.max_output))
        if case.forbid and re.search(case.forbid, combined):
            problems.append("output matches what it must not: %s" % case.forbid)
        changes = diff(before, after, case.may_change)
        if changes:
            problems.append("the work directory changed:\n    " + "\n    ".join(changes))
        for rel in case.must_exist:
            if not os.path.lexists(work / rel):
                problems.append("%s was not written" % rel)
        if case.post and not problems:
            why = case.post(work, self)
            if why:
                problems.append(why)

        if problems:
            print("FAIL %s:\n  - %s" % (case.name, "\n  - ".join(problems)))
            print("  (work directory kept: %s)" % work)
            return "fail", seconds
        print("PASS %s (%.2f s)" % (case.name, seconds))
        if not self.keep:
            shutil.rmtree(home, ignore_errors=True)
        return "pass", seconds


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help="cases to run (default: all)")
    ap.add_argument("--meshlm", help="the meshlm executable")
    ap.add_argument("--mpiexec", help="mpiexec (default: the one on PATH)")
    ap.add_argument("--numproc-flag", default="-n")
    ap.add_argument("--preflags", help="flags after -n N (default: Open MPI's root/oversubscribe flags)")
    ap.add_argument("--scratch", default=None, help="work directories (default: ./badinput-scratch)")
    ap.add_argument("--fixtures", help="fixture directory (default: SCRATCH/fixtures)")
    ap.add_argument("--make-fixtures", action="store_true", help="(re)make the fixtures and exit")
    ap.add_argument("--group", action="append", help="run only this group (repeatable)")
    ap.add_argument("--run-pending", action="store_true", help="run PENDING cases instead of skipping them")
    ap.add_argument("--keep", action="store_true", help="keep the work directories of passing cases")
    ap.add_argument("--list", action="store_true", help="print: name group bound pending")
    args = ap.parse_args()

    problems = case_table.check_table()
    if problems:
        raise SystemExit("cases.py: " + "; ".join(problems))
    if args.list:
        for c in case_table.CASES:
            print(c.name, c.group, int(c.timeout), int(c.name in case_table.PENDING))
        return 0
    if not args.meshlm:
        ap.error("--meshlm is required")
    args.scratch = args.scratch or os.path.join(os.getcwd(), "badinput-scratch")
    runner = Runner(args)
    if args.make_fixtures:
        runner.make_fixtures()
        return 0

    by_name = {c.name: c for c in case_table.CASES}
    unknown = [n for n in args.names if n not in by_name]
    if unknown:
        raise SystemExit("no such case: %s" % ", ".join(unknown))
    selected = [by_name[n] for n in args.names] if args.names else list(case_table.CASES)
    if args.group:
        selected = [c for c in selected if c.group in args.group]
    need_run = [c for c in selected if args.run_pending or c.name not in case_table.PENDING]
    if need_run and not runner.have_fixtures():
        runner.make_fixtures()

    results = {}
    t0 = time.monotonic()
    for c in selected:
        results[c.name] = runner.run_case(c, args.run_pending)
        if len(selected) > 1:
            print()
    if len(selected) == 1:
        return {"pass": 0, "fail": 1, "pending": SKIP}[results[selected[0].name][0]]
    counts = {k: [n for n, (r, _) in results.items() if r == k] for k in ("pass", "fail", "pending")}
    print("==== %d cases in %.1f s: %d passed, %d failed, %d pending (skipped)"
          % (len(selected), time.monotonic() - t0, len(counts["pass"]), len(counts["fail"]),
             len(counts["pending"])))
    for n in counts["fail"]:
        print("  FAILED  %s%s" % (n, "  (pending: %s)" % case_table.PENDING[n]
                                  if n in case_table.PENDING else ""))
    if args.run_pending:
        for n in counts["pass"]:
            if n in case_table.PENDING:
                print("  PASSES NOW, remove from PENDING: %s" % n)
    return 1 if counts["fail"] else 0


if __name__ == "__main__":
    sys.exit(main())
