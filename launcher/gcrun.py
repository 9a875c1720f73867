"""gcrun: starts a gradcomp job through mpirun, the way horovodrun does.

    gcrun -np 4 --compression maxmin --bits 4 /usr/bin/python3 train.py --epochs 5
    gcrun -np 8 -H node1:4,node2:4 --hierarchical python3 train.py
    gcrun -np 2 --dry-run python3 train.py          # prints the mpirun command only

Every gradcomp flag becomes the GRADCOMP_* variable of the same meaning; GRADCOMP_*/CGX_*/HOROVOD_*
variables already set, PATH, LD_LIBRARY_PATH, PYTHONPATH, OMP_NUM_THREADS and USE_LIBUV reach every
rank. Each rank also gets what torch.distributed's env:// needs (MASTER_ADDR, MASTER_PORT, RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE), so an existing DDP script runs unchanged, and what
torchrun gives its workers unless set (worker_defaults: OMP_NUM_THREADS=1, USE_LIBUV=0). gcrun exits with the
exit code of the first rank that failed; Ctrl-C stops every rank.
"""
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys

from gcrun_hosts import LaunchError, parse_hosts, read_hostfile  # noqa: F401 (LaunchError: gcrun's)

USAGE = "usage: gcrun -np N [options] COMMAND [ARGS...]   (gcrun --help for the options)"


# flag -> (destination, kind, help). kind: "int", "float", "str", "bool" (no value).
FLAGS = {
    "-np": ("np", "int", "number of ranks to start"),
    "-H": ("hosts", "str", "hosts and slots: host1:4,host2:4 (slots default to 1)"),
    "--hosts": ("hosts", "str", "same as -H"),
    "--hostfile": ("hostfile", "str", "an Open MPI hostfile ('host slots=N' per line)"),
    "--compression": ("GRADCOMP_COMPRESSION", "str", "none, fp16, bf16, maxmin, topk or auto (per tensor)"),
    "--bits": ("GRADCOMP_BITS", "int", "max-min quantization bits (1-8)"),
    "--bucket-size": ("GRADCOMP_BUCKET_SIZE", "int", "max-min bucket size"),
    "--topk-ratio": ("GRADCOMP_TOPK_RATIO", "float", "fraction of values top-k keeps"),
    "--error-feedback": ("GRADCOMP_ERROR_FEEDBACK", "bool", "keep compression residuals per tensor"),
    "--auto-candidates": ("GRADCOMP_AUTO_CANDIDATES", "str", "with --compression auto: the settings chosen from"),
    "--auto-interval": ("GRADCOMP_AUTO_INTERVAL", "int", "with --compression auto: steps between two choices"),
    "--fusion-threshold-mb": ("GRADCOMP_FUSION_THRESHOLD_MB", "float", "fusion buffer size in MB"),
    "--cycle-time-ms": ("GRADCOMP_CYCLE_TIME_MS", "float", "coordinator cycle time in ms"),
    "--hierarchical": ("GRADCOMP_HIERARCHICAL", "bool", "node-local reduce + cross-node allreduce"),
    "--autotune": ("GRADCOMP_AUTOTUNE", "bool", "tune the fusion threshold and cycle time while training"),
    "--autotune-log-file": ("GRADCOMP_AUTOTUNE_LOG", "str", "CSV of every setting autotune scored"),
    "--timeline-filename": ("GRADCOMP_TIMELINE", "str", "write a Chrome-trace timeline here"),
    "--stall-check-warning-time-seconds": ("GRADCOMP_STALL_CHECK_TIME_SECONDS", "float",
                                           "warn about tensors some ranks have not submitted after this"),
    "--stall-check-shutdown-time-seconds": ("GRADCOMP_STALL_SHUTDOWN_TIME_SECONDS", "float",
                                            "stop every rank after a stall this long (0: never)"),
    "--log-level": ("GRADCOMP_LOG_LEVEL", "str", "trace, debug, info, warning, error or off"),
    "--verbose": ("verbose", "bool", "print the mpirun command and log at debug level"),
    "--output-filename": ("output_filename", "str", "directory for per-rank stdout/stderr logs"),
    "--network-interface": ("network_interface", "str",
                            "the network interfaces to use between nodes, comma-separated (eth0 or eth0,eth1): "
                            "gradcomp's TCP connections, Open MPI's (btl_tcp_if_include) and NCCL's"),
    "--mpi-args": ("mpi_args", "str", "extra arguments for mpirun, quoted: --mpi-args='--mca btl tcp,self'"),
    "--mpirun": ("mpirun", "str", "the mpirun to use (default: the one on PATH)"),
    "--dry-run": ("dry_run", "bool", "print the mpirun command and exit"),
    "--torchrun": ("torchrun", "bool", "print the torchrun command that runs the same job without MPI, and exit"),
    "--elastic": ("elastic", "bool", "relaunch on the hosts available when ranks fail or hosts change"),
    "--min-np": ("min_np", "int", "with --elastic: fewest ranks to run with (default -np)"),
    "--max-np": ("max_np", "int", "with --elastic: most ranks to run with (default -np)"),
    "--host-discovery-script": ("host_discovery_script", "str", "with --elastic: prints the hosts available, host:slots per line"),
    "--reset-limit": ("reset_limit", "int", "with --elastic: most relaunches before giving up (default: no limit)"),
    "--elastic-timeout": ("elastic_timeout", "float", "with --elastic: seconds to wait for --min-np slots (600)"),
    "--blacklist-after": ("blacklist_after", "int", "with --elastic: failures after which a host is not used again (2)"),
    "--failure-cooldown": ("failure_cooldown", "float", "with --elastic: seconds a host sits out after a failure (60)"),
    "--elastic-dir": ("elastic_dir", "str", "with --elastic: where ranks keep their last commit (default: a temporary directory)"),
}
# horovodrun's flags under horovodrun's names, so that a horovodrun command line runs as it is:
# its names for gcrun's flags, then flags of its own. kind "set:V" takes no value and sets V;
# dest "ignored" is a flag with nothing to do here, accepted with a note saying why.
_ALIASES = {"--num-proc": "-np", "-n": "-np", "--np": "-np", "--hierarchical-allreduce": "--hierarchical",
            "--network-interfaces": "--network-interface", "--min-num-proc": "--min-np",
            "--max-num-proc": "--max-np", "-hostfile": "--hostfile", "-p": "--ssh-port", "-i": "--ssh-identity-file",
            "-prefix-timestamp": "--prefix-output-with-timestamp", "--log-hide-timestamp": "--log-without-timestamp"}
HOROVODRUN_FLAGS = {
    "--no-hierarchical-allreduce": ("GRADCOMP_HIERARCHICAL", "set:0", "no node-local step (the default)"),
    "--cache-capacity": ("GRADCOMP_CACHE_CAPACITY", "int", "response cache entries (0 disables the cache)"),
    "--timeline-mark-cycles": ("GRADCOMP_TIMELINE_MARK_CYCLES", "bool", "mark each background cycle in the timeline"),
    "--no-autotune": ("GRADCOMP_AUTOTUNE", "set:0", "no autotuning (the default)"),
    "--no-stall-check": ("GRADCOMP_STALL_CHECK_TIME_SECONDS", "set:0", "no stall warnings"),
    "--gloo": ("GRADCOMP_CONTROLLER", "set:gloo", "negotiate over gradcomp's TCP connections (Horovod's Gloo "
               "controller's place; ranks still start through mpirun)"),
    "--mpi": ("GRADCOMP_CONTROLLER", "set:mpi", "negotiate over MPI"),
    "--ssh-port": ("ssh_port", "int", "-p: the hosts' ssh port (Open MPI's plm_rsh_args)"),
    "--ssh-identity-file": ("ssh_identity_file", "str", "-i: the ssh private key (Open MPI's plm_rsh_args)"),
    "--binding-args": ("binding_args", "str", "mpirun's binding arguments, in place of --bind-to none --map-by slot"),
    "--prefix-output-with-timestamp": ("timestamp_output", "bool", "-prefix-timestamp: timestamp each output line"),
    "--tcp": ("tcp", "bool", "MPI over TCP only (--mca pml ob1 --mca btl ^openib)"),
    "--hierarchical-allgather": ("ignored", "bool", "gradcomp's allgather has no hierarchical form"),
    "--no-hierarchical-allgather": ("ignored", "bool", "gradcomp's allgather is flat"),
    "--disable-cache": ("ignored", "bool", "gcrun runs no start-up checks to cache"),
    "--start-timeout": ("ignored", "int", "gcrun runs no start-up checks (GRADCOMP_COLLECTIVE_TIMEOUT_SECONDS bounds "
                        "init)"),
    "--num-nccl-streams": ("ignored", "int", "gradcomp uses one stream per GPU"),
    "--thread-affinity": ("ignored", "int", "gradcomp does not pin its background thread"),
    "--gloo-timeout-seconds": ("ignored", "int", "GRADCOMP_COLLECTIVE_TIMEOUT_SECONDS and "
                               "--stall-check-shutdown-time-seconds bound waits"),
    "--mpi-threads-disable": ("ignored", "bool", "gradcomp needs MPI's thread support (process sets)"),
    "--log-with-timestamp": ("ignored", "bool", "gradcomp's log lines always carry their time"),
    "--log-without-timestamp": ("ignored", "bool", "gradcomp's log lines always carry their time"),
    "--autotune-warmup-samples": ("ignored", "int", "gradcomp's autotune scores GRADCOMP_AUTOTUNE_WINDOW_SECONDS "
                                  "windows"),
    "--autotune-steps-per-sample": ("ignored", "int", "gradcomp's autotune scores windows of time"),
    "--autotune-bayes-opt-max-samples": ("ignored", "int", "gradcomp's autotune is a coordinate search"),
    "--autotune-gaussian-process-noise": ("ignored", "float", "gradcomp's autotune is a coordinate search"),
}
# horovodrun flags gcrun cannot honour: an error saying what to do instead.
_REFUSED = {"--jsrun": "gcrun starts the ranks with mpirun; jsrun is not supported",
            "--config-file": "horovodrun's YAML configuration files are not read; pass the settings as flags",
            "--blacklist-cooldown-range": "use --failure-cooldown SECONDS (with --elastic)",
            "--slots-per-host": "give the slots in the host discovery script's lines (host:slots)"}
FORWARDED_VARIABLES = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "OMP_NUM_THREADS", "USE_LIBUV")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def help_text():
    lines = [__doc__.strip(), "", USAGE, "", "options:"]

    def describe(table):
        for flag, (dest, kind, text) in table.items():
            arg = "" if kind == "bool" or kind.startswith("set:") else " " + kind.upper()
            lines.append(f"  {flag + arg:<46} {'(no effect) ' if dest == 'ignored' else ''}{text}")

    describe(FLAGS)
    lines.append(f"  {'-h, --help':<46} show this help")
    lines += ["", "horovodrun's flags, so that a horovodrun command line runs unchanged:"]
    for alias, flag in _ALIASES.items():
        lines.append(f"  {alias:<46} {flag}")
    describe(HOROVODRUN_FLAGS)
    lines += [f"  {flag:<46} refused: {why}" for flag, why in _REFUSED.items()]
    return "\n".join(lines)


def _convert(flag, kind, value):
    try:
        if kind == "int":
            return int(value)
        if kind == "float":
            return float(value)
    except ValueError:
        raise LaunchError(f"{flag} expects {'an integer' if kind == 'int' else 'a number'}, got {value!r}") from None
    return value


def parse_args(argv):
    """Splits argv into gcrun's options (a dict) and the command to run."""
    opts = {"settings": {}}
    i = 0
    while i < len(argv):
        token = argv[i]
        if not token.startswith("-") or token == "-":
            break
        if token in ("-h", "--help"):
            opts["help"] = True
            return opts, []
        flag, value = token, None
        if token.startswith("--") and "=" in token:
            flag, value = token.split("=", 1)
        flag = _ALIASES.get(flag, flag)
        if flag in _REFUSED:
            raise LaunchError(f"{token}: {_REFUSED[flag]}")
        if flag not in FLAGS and flag not in HOROVODRUN_FLAGS:
            raise LaunchError(f"unknown flag {token} (gcrun --help lists the flags; put the command after them)")
        dest, kind, reason = FLAGS.get(flag) or HOROVODRUN_FLAGS[flag]
        if kind == "bool" or kind.startswith("set:"):
            if value is not None:
                raise LaunchError(f"{flag} takes no value")
            converted = True if kind == "bool" else kind[len("set:"):]
        else:
            if value is None:
                i += 1
                if i >= len(argv):
                    raise LaunchError(f"{flag} needs a value")
                value = argv[i]
            converted = _convert(flag, kind, value)
        if dest == "ignored":
            opts.setdefault("notes", []).append(f"{token.split('=', 1)[0]} has no effect: {reason}")
        elif dest.startswith("GRADCOMP_"):
            opts["settings"][dest] = ("1" if converted is True else str(converted))
        elif dest == "network_interface" and opts.get(dest):
            # given again (horovodrun's --network-interface eth0 --network-interface eth1)
            opts[dest] += "," + converted
        else:
            opts[dest] = converted
        i += 1
    return opts, argv[i:]


def _is_local(host):
    return host in ("localhost", "127.0.0.1", socket.gethostname(), socket.getfqdn())


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def find_mpirun(explicit=None):
    path = explicit or shutil.which("mpirun")
    if not path or not os.access(path, os.X_OK):
        raise LaunchError("mpirun not found" + (f" at {explicit}" if explicit else " on PATH") +
                          "; install Open MPI (apt-get install openmpi-bin) or pass --mpirun PATH")
    return path


def worker_defaults(env, np_, hosts):
    """What torchrun sets for its workers unless the user did, which a torchrun user expects
    under gcrun too: {variable: value}, each absent from `env`.
    - OMP_NUM_THREADS=1 where a host runs several ranks (torch would give each rank a thread per
      core, and the ranks together oversubscribe the cores: 9x slower on the digits job).
    - USE_LIBUV=0: torch 2.4+'s env:// store defaults to its libuv server, which some torch
      builds lack (Debian's: "use_libuv was requested but PyTorch was build without libuv
      support"); the classic server is in every torch and serves a job's ranks as well."""
    defaults = {}
    if "OMP_NUM_THREADS" not in env and np_ > (len(hosts) if hosts else 1):
        defaults["OMP_NUM_THREADS"] = "1"
    if "USE_LIBUV" not in env:
        defaults["USE_LIBUV"] = "0"
    return defaults


def announce(assigned):
    """The one line torchrun prints when it chooses the ranks' threads."""
    if assigned.get("OMP_NUM_THREADS") == "1":
        print("gcrun: setting OMP_NUM_THREADS=1 for every rank (as torchrun does) so that the ranks' intra-op "
              "threads do not oversubscribe the cores; set OMP_NUM_THREADS to tune it for your job",
              file=sys.stderr, flush=True)


# Sets what torch.distributed's env:// reads from Open MPI's per-rank variables, then runs the command.
_RANK_SHIM = ('export RANK="$OMPI_COMM_WORLD_RANK" WORLD_SIZE="$OMPI_COMM_WORLD_SIZE" '
              'LOCAL_RANK="$OMPI_COMM_WORLD_LOCAL_RANK" LOCAL_WORLD_SIZE="$OMPI_COMM_WORLD_LOCAL_SIZE"; exec "$@"')


def build_command(opts, command, env=None, is_root=None, cpu_count=None, port=None):
    """The mpirun argv, the environment it runs with, and the variables gcrun set in it."""
    env = dict(os.environ if env is None else env)
    before = dict(env)
    is_root = (os.geteuid() == 0) if is_root is None else is_root
    cpu_count = (os.cpu_count() or 1) if cpu_count is None else cpu_count
    if not command:
        raise LaunchError("no command to run (gcrun -np N COMMAND ...)")
    np_ = opts.get("np")
    if np_ is None:
        raise LaunchError("-np is required (the number of ranks)")
    if np_ < 1:
        raise LaunchError(f"-np must be at least 1, got {np_}")
    if opts.get("hosts") and opts.get("hostfile"):
        raise LaunchError("use either -H/--hosts or --hostfile, not both")
    hosts = parse_hosts(opts["hosts"]) if opts.get("hosts") else None
    if opts.get("hostfile"):
        hosts = read_hostfile(opts["hostfile"])
    slots = sum(n for _, n in hosts) if hosts else cpu_count

    args = [find_mpirun(opts.get("mpirun")), "-np", str(np_)]
    if is_root:
        args.append("--allow-run-as-root")
    if hosts and opts.get("hosts"):
        args += ["-H", ",".join(f"{h}:{n}" for h, n in hosts)]
    if opts.get("hostfile"):
        args += ["--hostfile", opts["hostfile"]]
    if np_ > slots:
        args.append("--oversubscribe")
    if opts.get("binding_args"):
        args += shlex.split(opts["binding_args"])
    else:
        args += ["--bind-to", "none", "--map-by", "slot"]
    ssh = ([f"-p {opts['ssh_port']}"] if opts.get("ssh_port") is not None else []) + \
          ([f"-i {shlex.quote(opts['ssh_identity_file'])}"] if opts.get("ssh_identity_file") else [])
    if ssh:
        args += ["--mca", "plm_rsh_args", " ".join(ssh)]
    if opts.get("timestamp_output"):
        args.append("--timestamp-output")
    if opts.get("tcp"):
        args += ["--mca", "pml", "ob1", "--mca", "btl", "^openib"]
    if opts.get("output_filename"):
        args += ["--output-filename", opts["output_filename"]]
    nics = opts.get("network_interface")
    if nics is not None:
        if not re.fullmatch(r"[\w.:@-]+(,[\w.:@-]+)*", nics):
            raise LaunchError("--network-interface takes interface names separated by commas (eth0,eth1), "
                              f"got {nics!r}")
        # As horovodrun's --network-interface: MPI's transport, and NCCL's sockets (bootstrap, and data without IB).
        args += ["--mca", "btl_tcp_if_include", nics, "-x", f"NCCL_SOCKET_IFNAME={nics}"]
    if opts.get("mpi_args"):
        args += shlex.split(opts["mpi_args"])

    # Settings from flags override the caller's environment.
    env.update(opts["settings"])
    if nics is not None:
        env["GRADCOMP_CONTROLLER_IFACE"] = nics
    if opts.get("verbose") and "GRADCOMP_LOG_LEVEL" not in opts["settings"]:
        env["GRADCOMP_LOG_LEVEL"] = "debug"
    # The package built in this checkout, when gcrun runs from one.
    built = os.path.join(REPO_ROOT, "build", "python")
    if os.path.isdir(os.path.join(built, "gradcomp")):
        parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        if built not in parts:
            env["PYTHONPATH"] = os.pathsep.join([built] + parts)
    master = "127.0.0.1"
    if hosts and not all(_is_local(h) for h, _ in hosts):
        master = hosts[0][0]
    env.update(worker_defaults(env, np_, hosts))
    env.setdefault("MASTER_ADDR", master)
    env.setdefault("MASTER_PORT", str(port if port is not None else free_port()))

    names = sorted(k for k in env if k.startswith(("GRADCOMP_", "CGX_", "HOROVOD_")))
    names += [k for k in FORWARDED_VARIABLES + ("MASTER_ADDR", "MASTER_PORT") if k in env]
    for name in names:
        args += ["-x", name]
    args += ["/bin/sh", "-c", _RANK_SHIM, "gcrun-rank"] + list(command)
    assigned = {k: v for k, v in env.items() if before.get(k) != v}
    return args, env, assigned


def run(argv):
    opts, command = parse_args(argv)
    if opts.get("help"):
        print(help_text())
        return 0
    for note in opts.get("notes", []):
        print(f"gcrun: note: {note}", file=sys.stderr, flush=True)
    if opts.get("torchrun"):
        if not command:
            raise LaunchError("no command to run (gcrun -np N --torchrun COMMAND ...)")
        import gcrun_torchrun  # the sibling module: launcher/gcrun_torchrun.py
        print(gcrun_torchrun.torchrun_line(opts, command, LaunchError))
        return 0
    announced = []

    def build_and_announce(opts, command):
        args, env, assigned = build_command(opts, command)
        if not announced and not opts.get("dry_run"):  # a dry run shows the variables in its line
            announce(assigned)
            announced.append(True)
        return args, env, assigned

    if opts.get("elastic"):
        if opts.get("dry_run"):
            raise LaunchError("--dry-run does not apply to --elastic (every launch is printed as it happens)")
        import elastic  # the sibling module: launcher/elastic.py
        return elastic.Elastic(opts, command, build_and_announce, LaunchError).run()
    for flag in ("min_np", "max_np", "host_discovery_script", "reset_limit", "elastic_timeout", "blacklist_after",
                 "failure_cooldown", "elastic_dir"):
        if opts.get(flag) is not None:
            raise LaunchError(f"--{flag.replace('_', '-')} needs --elastic")
    args, env, assigned = build_and_announce(opts, command)
    if opts.get("dry_run") or opts.get("verbose"):
        # A shell line that runs the same job: the variables gcrun sets, then mpirun.
        shown = " ".join([f"{k}={shlex.quote(v)}" for k, v in sorted(assigned.items())] +
                         [shlex.quote(a) for a in args])
        print(shown, file=sys.stdout if opts.get("dry_run") else sys.stderr, flush=True)
        if opts.get("dry_run"):
            return 0
    # mpirun in its own process group: on Ctrl-C gcrun forwards the signal once (mpirun then
    # stops every rank it started) and waits for it; a second Ctrl-C kills the group.
    proc = subprocess.Popen(args, env=env, start_new_session=True)
    interrupted = []

    def forward(signum, frame):
        del frame
        if interrupted:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            interrupted.append(signum)
            try:
                proc.send_signal(signal.SIGINT if signum == signal.SIGINT else signal.SIGTERM)
            except ProcessLookupError:
                pass

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = proc.wait()
        try:  # anything mpirun left behind in its process group
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    if interrupted:
        return 128 + interrupted[0]
    return code if code >= 0 else 128 - code


def main(argv=None):
    try:
        return run(sys.argv[1:] if argv is None else argv)
    except LaunchError as e:
        print(f"gcrun: error: {e}\n{USAGE}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
