"""gcrun --elastic: keeps a job running while hosts fail, leave and join (torchrun's design over MPI).

An MPI world cannot change its members, so every change of membership is a relaunch: gcrun
starts mpirun on the hosts available, and

- when the ranks finish (exit 0), so does gcrun;
- when the discovered hosts change (the script's output, or a failed host's cooldown ending),
  gcrun sends SIGUSR1 to the job (mpirun forwards it to every rank) until the ranks stop at
  their next commit (gradcomp.torch.elastic: state.commit() raises HostsUpdatedInterrupt on
  every rank at once, the ranks exit with RESTART_EXIT) and relaunches on the new hosts; a
  host in use that disappears and whose ranks do not stop within --elastic-timeout ends the
  job the hard way;
- when a rank fails (mpirun names it), its host sits out --failure-cooldown seconds (unless
  leaving it out would go below --min-np) and is blacklisted for the rest of the job after
  --blacklist-after failures; gcrun relaunches on the rest.

Each relaunch counts against --reset-limit. The ranks find their last commit in --elastic-dir
(default: a directory gcrun makes and removes; the same path on every host, where each host's
first rank writes its copy at every commit), so a relaunched job goes on from the last commit.
Every decision is printed as a 'gcrun: elastic: ...' line.
"""
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from gcrun_hosts import parse_hosts, read_hostfile

DISCOVERY_INTERVAL = 1.0  # seconds between two looks at the hosts (as Horovod's driver)
RESTART_EXIT = 75  # the ranks' status when they stop at a commit for a change of hosts (EX_TEMPFAIL)

# Who failed, most reliable first: Open MPI's report of a rank killed by a signal; a rank's own
# report of an exception in the training function (gradcomp/elastic.py: ranks that stop
# because a collective failed say something else, they are not to blame); a survivor's report
# that it lost its connection to a rank (gradcomp's TCP connections: the survivor exits at once
# and mpirun may report its exit first); Open MPI's report that a survivor's TCP peer
# disconnected, naming the dead rank's host (when a survivor's eager send to
# the dead rank fails, Open MPI aborts it at once, and mpirun may report that abort instead of
# the killed rank: the survivor's exit status must not blame its own host); Open MPI's report
# of the first rank with a non-zero status (printed only in some cases, e.g. not when every
# rank fails before MPI starts: then no host is blamed, and the reset limit bounds the retries).
# A link gone silent has each side say it cannot reach the other: the rank that the most ranks
# cannot reach is blamed (before any report of a lost connection, which a rank exiting on that
# error causes in its peers), so the hosts that still reach each other go on.
_KILLED = re.compile(r"process rank (\d+) with PID \d+ on node (\S+) exited on\s+signal (\d+)")  # Open MPI 5 wraps
_RAISED = re.compile(r"gradcomp elastic: rank (\d+) failed: ")
_LOST = re.compile(r"tcp communicator: rank \d+ lost its connection to rank (\d+)")
_UNREACHABLE = re.compile(r"tcp communicator: rank (\d+) cannot reach rank (\d+)")
_DISCONNECTED = re.compile(r"peer process has unexpectedly disconnected\..*?Peer host:\s*(\S+)", re.S)
_FAILED = re.compile(r"Process name: \[\[\d+,\d+\],(\d+)\]")
# mpirun's (Open MPI 4) or prterun's (Open MPI 5) word that it is ending the job. It exits once
# every host's daemon has ended its ranks: a host whose link went silent answers nothing, and
# mpirun would wait for it until the link came back. ABORT_GRACE seconds after the word, gcrun
# ends mpirun itself and goes on as if it had exited.
_ENDING = re.compile(r"job has been aborted|causing\s+the\s+job\s+to\s+be\s+terminated|"
                     r"noticed\s+that\s+process\s+rank")
ABORT_GRACE = 10.0


def say(message):
    print(f"gcrun: elastic: {message}", file=sys.stderr, flush=True)


def parse_discovered(text, source):
    """A discovery script's output ('host:slots' or 'host' per line) -> {host: slots}."""
    hosts = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, slots = line.partition(":")
        try:
            n = int(slots) if slots else 1
        except ValueError:
            raise ValueError(f"{source} line {lineno}: bad slots in {line!r} (expected host:slots)") from None
        if not name or n < 1 or any(c.isspace() for c in name):
            raise ValueError(f"{source} line {lineno}: bad host {line!r} (expected host:slots, slots >= 1)")
        hosts[name] = hosts.get(name, 0) + n
    return hosts


class Discovery:
    """The hosts available now: a fixed list, or what a discovery script prints."""

    def __init__(self, script=None, fixed=None):
        self.script, self.fixed = script, fixed
        self.last = dict(fixed) if fixed else {}
        self.complained = None

    def hosts(self):
        if self.script is None:
            return dict(self.fixed)
        try:
            out = subprocess.run(self.script, shell=True, capture_output=True, text=True, timeout=60)
            if out.returncode != 0:
                raise ValueError(f"exited with status {out.returncode}: {out.stderr.strip()[-300:]}")
            self.last = parse_discovered(out.stdout, f"--host-discovery-script {self.script!r}")
            self.complained = None
        except (ValueError, OSError, subprocess.TimeoutExpired) as e:
            if str(e) != self.complained:  # once per kind of failure, keep the last good answer
                say(f"host discovery failed ({e}); keeping the last hosts found: {fmt(self.last)}")
                self.complained = str(e)
        return dict(self.last)


def address(host):
    try:
        return socket.gethostbyname(host)
    except OSError:
        return None


def same_host(peer, used):
    """The host in `used` that Open MPI's `peer` names (it prints a name or an address), or None."""
    if peer in used:
        return peer
    wanted = address(peer)
    return next((h for h in used if wanted is not None and address(h) == wanted), None)


def unreachable_rank(text):
    """The rank that the most ranks say they cannot reach (_UNREACHABLE), or None."""
    claims = {}
    for claimant, rank in _UNREACHABLE.findall(text):
        claims.setdefault(int(rank), set()).add(int(claimant))
    return max(sorted(claims), key=lambda r: len(claims[r])) if claims else None


def fmt(hosts):
    return ",".join(f"{h}:{n}" for h, n in hosts.items()) or "(none)"


class Elastic:
    def __init__(self, opts, command, build_command, launch_error):
        self.opts, self.command, self.build_command, self.LaunchError = opts, command, build_command, launch_error
        self.min_np = opts.get("min_np") or opts.get("np") or 1
        self.max_np = opts.get("max_np") or opts.get("np")
        if self.min_np < 1:
            raise launch_error(f"--min-np must be at least 1, got {self.min_np}")
        if self.max_np is not None and self.max_np < self.min_np:
            raise launch_error(f"--max-np {self.max_np} is below --min-np {self.min_np}")
        self.reset_limit = opts.get("reset_limit")
        if self.reset_limit is not None and self.reset_limit < 0:
            raise launch_error(f"--reset-limit must be >= 0, got {self.reset_limit}")
        self.timeout = opts.get("elastic_timeout", 600.0)
        self.blacklist_after = opts.get("blacklist_after", 2)
        if self.blacklist_after < 1:
            raise launch_error(f"--blacklist-after must be at least 1, got {self.blacklist_after}")
        self.cooldown = opts.get("failure_cooldown", 60.0)
        script = opts.get("host_discovery_script")
        fixed = None
        if script is None:
            if not (opts.get("hosts") or opts.get("hostfile")):
                raise launch_error("--elastic needs --host-discovery-script or a host list (-H or --hostfile)")
            pairs = parse_hosts(opts["hosts"]) if opts.get("hosts") else read_hostfile(opts["hostfile"])
            fixed = {}
            for h, n in pairs:
                fixed[h] = fixed.get(h, 0) + n
        elif opts.get("hosts") or opts.get("hostfile"):
            raise launch_error("use either --host-discovery-script or -H/--hostfile with --elastic, not both")
        self.discovery = Discovery(script, fixed)
        self.failures = {}      # host -> failures so far
        self.blacklist = set()
        self.cooling = {}       # host -> time its cooldown ends
        self.resets = 0
        self.made_dir = opts.get("elastic_dir") is None
        self.dir = opts.get("elastic_dir") or tempfile.mkdtemp(prefix="gcrun-elastic-")

    # -- which hosts a launch gets -------------------------------------------------------------
    def usable(self, discovered, now):
        """Hosts to launch on now: discovered, not blacklisted, not cooling down (unless the
        others are too few for --min-np)."""
        ok = {h: n for h, n in discovered.items() if h not in self.blacklist}
        warm = {h: n for h, n in ok.items() if self.cooling.get(h, 0) <= now}
        if sum(warm.values()) >= self.min_np or sum(ok.values()) < self.min_np:
            return warm
        return ok

    def plan(self, hosts):
        """{host: slots used} for a launch: hosts in order until max-np slots."""
        left = self.max_np if self.max_np is not None else sum(hosts.values())
        used = {}
        for h, n in hosts.items():
            if left <= 0:
                break
            used[h] = min(n, left)
            left -= used[h]
        return used

    def wait_for_hosts(self):
        deadline = time.time() + self.timeout
        told = False
        while True:
            now = time.time()
            hosts = self.usable(self.discovery.hosts(), now)
            if sum(hosts.values()) >= self.min_np:
                return hosts
            if now > deadline:
                raise self.LaunchError(
                    f"--elastic-timeout {self.timeout:g} s: only {sum(hosts.values())} slots available "
                    f"({fmt(hosts)}; blacklisted: {sorted(self.blacklist) or 'none'}), --min-np is {self.min_np}")
            if not told:
                say(f"waiting for --min-np {self.min_np} slots: {fmt(hosts)} available "
                    f"(blacklisted: {sorted(self.blacklist) or 'none'})")
                told = True
            time.sleep(DISCOVERY_INTERVAL)

    # -- one launch ----------------------------------------------------------------------------
    def launch(self, used):
        np_ = sum(used.values())
        opts = dict(self.opts, np=np_, hosts=fmt(used), hostfile=None)
        opts["settings"] = dict(opts["settings"], GRADCOMP_ELASTIC="1", GRADCOMP_ELASTIC_DIR=self.dir,
                                GRADCOMP_ELASTIC_RESETS=str(self.resets))
        args, env, _ = self.build_command(opts, self.command)
        # Ranks start with SIGUSR1 ignored until gradcomp.torch.elastic installs its handler
        # (its default action would kill them); gcrun repeats a notice until it is acted on.
        shim = args.index("/bin/sh") + 2
        args[shim] = "trap '' USR1; " + args[shim]
        say(f"launch {self.resets}: {np_} ranks on {fmt(used)}")
        proc = subprocess.Popen(args, env=env, start_new_session=True, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, bufsize=0)
        lines = []

        def pump():  # mpirun's output through to ours, kept to find out who failed
            for raw in iter(proc.stdout.readline, b""):
                sys.stdout.buffer.write(raw)
                sys.stdout.flush()
                lines.append(raw.decode(errors="replace"))
                del lines[:-400]
        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        return proc, reader, lines

    def watch(self, proc, used, lines):
        """Waits for mpirun, notifying the ranks of host changes. Returns its exit status and
        the hosts in use that were gone when it ended."""
        notice_sent, gone_since, gone, ending_since = None, None, [], None
        while True:
            try:
                return proc.wait(timeout=DISCOVERY_INTERVAL), gone
            except subprocess.TimeoutExpired:
                pass
            now = time.time()
            if ending_since is None and _ENDING.search("".join(lines)):
                ending_since = now
            elif ending_since is not None and now - ending_since > ABORT_GRACE:
                say(f"mpirun said it is ending the job {ABORT_GRACE:g} s ago and has not exited (it waits for a host "
                    "it cannot reach): ending it")
                os.killpg(proc.pid, signal.SIGKILL)
                return proc.wait(), gone
            available = self.usable(self.discovery.hosts(), now)
            gone = sorted(h for h in used if available.get(h, 0) < used[h])
            wanted = self.plan(available)
            grown = sum(wanted.values()) > sum(used.values())
            if not gone and not grown:
                notice_sent, gone_since = None, None
                continue
            if notice_sent is None:
                what = f"hosts gone or shrunk: {gone}" if gone else f"more slots available: {fmt(wanted)}"
                say(f"{what}; asking the ranks to stop at their next commit")
            if notice_sent is None or now - notice_sent >= 5:
                try:
                    os.kill(proc.pid, signal.SIGUSR1)  # mpirun forwards it to every rank
                except ProcessLookupError:
                    pass
                notice_sent = now
            if gone:
                gone_since = gone_since or now
                if now - gone_since > self.timeout:
                    say(f"the ranks on {gone} did not stop within --elastic-timeout {self.timeout:g} s: ending the job")
                    os.killpg(proc.pid, signal.SIGKILL)

    def blame(self, lines, used):
        """The host of the rank mpirun reports as failed first, or None."""
        text = "".join(lines)
        m = _KILLED.search(text) or _RAISED.search(text)
        rank = int(m.group(1)) if m else unreachable_rank(text)
        if rank is None:
            m = _LOST.search(text)
            rank = int(m.group(1)) if m else None
        if rank is None:
            peer = _DISCONNECTED.search(text)
            if peer:
                return same_host(peer.group(1), used)
            m = _FAILED.search(text)
            rank = int(m.group(1)) if m else None
        if rank is not None:
            for h, n in used.items():
                if rank < n:
                    return h
                rank -= n
        return None

    def run(self):
        say(f"min-np {self.min_np}, max-np {self.max_np or 'all slots'}, reset limit "
            f"{self.reset_limit if self.reset_limit is not None else 'none'}, commits in {self.dir}")
        try:
            while True:
                try:
                    used = self.plan(self.wait_for_hosts())
                except KeyboardInterrupt:
                    return 130
                proc, reader, lines = self.launch(used)
                try:
                    code, gone = self.watch(proc, used, lines)
                except KeyboardInterrupt:  # Ctrl-C: mpirun stops every rank it started
                    say("interrupted: stopping the job")
                    proc.send_signal(signal.SIGINT)
                    try:
                        proc.wait(timeout=15)
                    except subprocess.TimeoutExpired:
                        pass
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    return 130
                reader.join(timeout=5)
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                if code == 0:
                    say(f"job finished after {self.resets} resets")
                    return 0
                if code == RESTART_EXIT:
                    say("the ranks stopped at a commit for the change of hosts")
                elif gone:
                    say(f"the job ended (status {code}) while {gone} were gone: relaunching without them, "
                        "no host blamed")
                else:
                    host = self.blame(lines, used)
                    status = f"signal {-code}" if code < 0 else f"status {code}"
                    if host is None:
                        say(f"the job failed ({status}) and mpirun did not say which rank; no host is blamed")
                    else:
                        self.failures[host] = self.failures.get(host, 0) + 1
                        if self.failures[host] >= self.blacklist_after:
                            self.blacklist.add(host)
                            say(f"a rank on {host} failed ({status}), failure {self.failures[host]} of that host: "
                                f"blacklisted for the rest of the job (--blacklist-after {self.blacklist_after})")
                        else:
                            self.cooling[host] = time.time() + self.cooldown
                            say(f"a rank on {host} failed ({status}), failure {self.failures[host]} of that host: "
                                f"left out for --failure-cooldown {self.cooldown:g} s")
                self.resets += 1
                if self.reset_limit is not None and self.resets > self.reset_limit:
                    say(f"--reset-limit {self.reset_limit} reached: giving up")
                    return code if 0 < code < 256 else 1
                say(f"relaunching (reset {self.resets}) from the last commit")
        finally:
            if self.made_dir:
                shutil.rmtree(self.dir, ignore_errors=True)
