"""gcrun's host lists (--hosts, --hostfile) and its error for a bad invocation: what both the
plain launch (gcrun.py) and the elastic one (elastic.py) read."""
import os


class LaunchError(Exception):
    """A bad invocation: the message is printed as 'gcrun: error: ...' with exit code 2."""


def parse_hosts(spec):
    """'h1:2,h2' -> [('h1', 2), ('h2', 1)]."""
    hosts = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            raise LaunchError(f"bad host list {spec!r}: empty entry (use host1:slots,host2:slots)")
        name, _, slots = part.partition(":")
        if not name or any(c.isspace() for c in name) or ":" in slots:
            raise LaunchError(f"bad host {part!r} in {spec!r} (use host or host:slots)")
        if slots == "":
            n = 1
        else:
            try:
                n = int(slots)
            except ValueError:
                raise LaunchError(f"bad slots {slots!r} for host {name!r}: expected a positive integer") from None
            if n < 1:
                raise LaunchError(f"bad slots {n} for host {name!r}: expected a positive integer")
        hosts.append((name, n))
    return hosts


def read_hostfile(path):
    """An Open MPI hostfile -> [(host, slots)] (for slot counting and MASTER_ADDR)."""
    if not os.path.isfile(path):
        raise LaunchError(f"--hostfile {path}: no such file")
    hosts = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            fields = line.split()
            slots = 1
            for field in fields[1:]:
                key, _, val = field.partition("=")
                if key == "slots":
                    try:
                        slots = int(val)
                    except ValueError:
                        raise LaunchError(f"--hostfile {path}:{lineno}: bad slots {val!r}") from None
            hosts.append((fields[0], slots))
    if not hosts:
        raise LaunchError(f"--hostfile {path}: no hosts in it")
    return hosts
