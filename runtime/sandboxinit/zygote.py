# The zygote: what a template's interpreter runs after driver.py, whose
# _driver it uses (the runtime hands the interpreter both, one after the
# other, as -c's program, with TEMPLATE_ARG after the script). Started
# and warmed as any interpreter (site, the preloads), it never runs a
# caller's code: it forks each call's code process into the namespaces
# the template's init made for the call (init_template.c), and returns in
# that process only, for the driver to run the code.
#
# The frames and fds are runtime/initproto's, substituted below by name
# between at signs.


def _zygote():
    # A template's interpreter: started and warmed as any (site, the
    # preloads), it then only forks. The template's init makes each call's
    # init, pid 1 of the call's new namespaces (init_template.c); the
    # zygote forks the code's process into them, which gives up every
    # privilege and installs the call's seccomp filter before it reads any
    # code; the call's init checks it did.
    # It returns, in the code's process only, for the driver to run the
    # code at the top level, where the interpreter ends as a script's does
    # (atexit, threads joined, the exit status of SystemExit).
    import ctypes
    import fcntl
    import gc
    import socket
    import struct

    libc = ctypes.CDLL(None, use_errno=True)
    z = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET, fileno=@ZYGOTE_FD@)
    own_pid_ns = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    # Nothing of the template's /tmp is to stay in reach of a fork.
    os.chdir("/")
    NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWPID, NEWNET = 0x20000, 0x2000000, 0x4000000, 0x8000000, 0x20000000, 0x40000000
    # A kernel without cgroup namespaces (gVisor's) has none to join; the
    # template's init made none either (init_template.c).
    cgroup_ns = NEWCGROUP if os.path.exists("/proc/self/ns/cgroup") else 0

    def check(r, what):
        if r != 0:
            e = ctypes.get_errno()
            raise OSError(e, "%s: %s" % (what, os.strerror(e)))

    prctl = libc.prctl
    prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
    capset = libc.capset
    # Everything a fork does is ready made here: each line it runs copies
    # the pages it touches (copy-on-write), which costs more than the line.
    # The capabilities this interpreter holds (the template's bounding
    # set): those the code's process drops.
    held = [c for c in range(64) if prctl(23, c, 0, 0, 0) == 1]  # PR_CAPBSET_READ
    cap_header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    no_caps = (ctypes.c_uint32 * 6)()

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    filters = {}

    def filter_of(bpf):
        # The call's seccomp program, ready to install (every call of a
        # template has the same).
        if bpf not in filters:
            buf = ctypes.create_string_buffer(bpf, len(bpf))
            filters[bpf] = (buf, Prog(len(bpf) // 8, ctypes.addressof(buf)))
        return ctypes.addressof(filters[bpf][1])

    def confine(uid, gid, prog):
        # The code's process: no capability in any set, the code's ids
        # and no group, no_new_privs (the template's, kept), then the
        # filter. A process of the code's uid again, it may read its own
        # /proc files, as one an exec made may.
        for cap in held:
            check(prctl(24, cap, 0, 0, 0), "dropping capability %d" % cap)  # PR_CAPBSET_DROP
        check(prctl(47, 4, 0, 0, 0), "clearing ambient capabilities")  # PR_CAP_AMBIENT_CLEAR_ALL
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
        check(capset(cap_header, no_caps), "clearing capabilities")
        check(prctl(38, 1, 0, 0, 0), "setting no_new_privs")  # PR_SET_NO_NEW_PRIVS
        check(prctl(4, 1, 0, 0, 0), "making the process dumpable")  # PR_SET_DUMPABLE
        check(prctl(22, 2, prog, 0, 0), "installing the seccomp filter")  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER

    def place(fds):
        # fds onto 0, 1, ..., by way of numbers above all of them (no dup2
        # may close a source), and nothing else open.
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 8) for fd in fds]
        for i, fd in enumerate(high):
            os.dup2(fd, i)
        os.closerange(len(fds), max(os.sysconf("SC_OPEN_MAX"), 1024))

    def reseed():
        # No generator state of the template's goes on in a fork: two calls
        # of one template (two clients, maybe) never draw the same numbers
        # nor share a secret. CPython reseeds random itself at fork; every
        # other generator the template holds (a preload's: sympy's, any
        # module's random.Random or numpy generator) is reseeded here from
        # the kernel's entropy, as is what the registry names that is no
        # such object. A module the code imports later seeds itself in the
        # fork.
        for g in generators:
            _reseed_generator(g)
        for name, again in _RESEED:
            m = sys.modules.get(name)
            if m is not None:
                again(m)

    def code_process(uid, gid, prog, pidfd, ends):
        # The code's process: in the call's namespaces (its pid namespace
        # already), its pipes on 0 to 4 and nothing else open, confined,
        # its generators reseeded. It returns to run the code.
        placed = False
        try:
            z.detach()  # its number is one of the code's pipes from now on
            check(libc.setns(pidfd, NEWNS | NEWNET | NEWIPC | NEWUTS | cgroup_ns), "joining the sandbox's namespaces")
            place(ends)
            placed = True
            confine(uid, gid, prog)
            reseed()
        except BaseException as e:
            try:
                os.write(2 if placed else ends[2], ("mcp-exec: the forked interpreter could not be confined: %s\n" % e).encode())
            finally:
                os._exit(125)
        return True

    def fork(req, fds):
        # A call's sandbox: the code's process forked into the pid
        # namespace of the call's init (fds[0], a pidfd), on its pipes
        # (fds[1:6]); its wait status to the init (fds[6]) once it ends.
        # True only in the code's process.
        uid, gid = struct.unpack(">II", req[:8])
        prog = filter_of(req[8:])
        pidfd, ends, status = fds[0], fds[1:6], fds[6]
        pid, err = -1, None
        if libc.setns(pidfd, NEWPID) != 0:
            err = "entering the call's pid namespace: " + os.strerror(ctypes.get_errno())
        else:
            try:
                pid = os.fork()
            except OSError as e:
                err = str(e)
            if pid == 0:
                return code_process(uid, gid, prog, pidfd, ends)
            # The next fork's pid namespace is another call's.
            check(libc.setns(own_pid_ns, NEWPID), "leaving the call's pid namespace")
        for fd in fds[:6]:
            os.close(fd)
        if err is not None:
            os.close(status)
            z.send(b"@Z_FAILED@" + err.encode())
            return False
        z.send(b"@Z_FORKED@" + pid.to_bytes(4, "big"))
        _, st = os.waitpid(pid, 0)
        try:
            os.write(status, (st & 0xFFFFFFFF).to_bytes(4, "big"))
        except OSError:
            pass  # the call's init is gone: the call is over anyway
        os.close(status)
        reap_rest()
        z.send(b"@Z_REAPED@")
        return False

    def reap_rest():
        # Every other child of this interpreter is the call's too: one the
        # code made its sibling (clone with CLONE_PARENT, which the filter
        # refuses). Until each is reaped the call's pid namespace cannot
        # end, nor the template serve the next call; the call's end kills
        # them (its init's death ends its pid namespace).
        while True:
            try:
                os.waitpid(-1, 0)
            except ChildProcessError:
                return

    # What the driver and the end of a fork import, imported once here.
    import ast, atexit, linecache, signal, traceback, types  # noqa: F401

    # The generators the template holds, found once, after the preloads
    # and the driver; each is reseeded here once, so that one a fork could
    # not reseed stops the template, not a call.
    generators = _generators()
    for g in generators:
        _reseed_generator(g)

    # What every fork shares is settled now: the collector need not visit
    # it again in each (sparing their copy-on-write pages).
    gc.collect()
    gc.freeze()
    base = frozenset(sys.modules)
    z.send(b"@Z_READY@")
    cmsg = socket.CMSG_SPACE(64 * 4)
    while True:
        try:
            msg, anc, _, _ = z.recvmsg(1 << 16, cmsg)
        except InterruptedError:
            continue
        if not msg:
            os._exit(0)
        fds = []
        for level, kind, data in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds += struct.unpack("%di" % (len(data) // 4), data[: len(data) // 4 * 4])
        if msg[:1] != b"@Z_FORK@" or len(msg) < 9 or len(fds) != 7:
            for fd in fds:
                os.close(fd)
            z.send(b"@Z_FAILED@a malformed fork request")
            continue
        if fork(msg[1:], fds):
            # The modules every fork starts with: the rest are its code's.
            return base


def _generators():
    # Every generator among the objects the template holds: random.Random
    # instances (random's own, sympy's rng, any module's) and numpy's
    # RandomState, Generator and BitGenerator objects, whoever made them.
    import gc
    import random

    kinds = [random.Random]
    np_random = sys.modules.get("numpy.random")
    for name in ("RandomState", "Generator", "BitGenerator"):
        kind = getattr(np_random, name, None)
        if isinstance(kind, type):
            kinds.append(kind)
    kinds = tuple(kinds)
    return [o for o in gc.get_objects() if isinstance(o, kinds)]


def _reseed_generator(g):
    # A generator's state anew from the kernel's entropy. One that cannot
    # be reseeded raises: a fork must not go on with it.
    import random

    if isinstance(g, random.Random):
        g.seed(os.urandom(32))
    elif type(g).__name__ == "RandomState":
        # Its seed() draws from the kernel, for an MT19937's only.
        try:
            g.seed()
        except TypeError:
            _reseed_generator(g._bit_generator)
    elif hasattr(g, "bit_generator"):
        _reseed_generator(g.bit_generator)
    else:
        g.state = type(g)(int.from_bytes(os.urandom(16), "big")).state


def _reseed_multiprocessing(m):
    # Its authkey authenticates the code's own processes to each other.
    m.current_process().authkey = os.urandom(32)


def _reseed_tempfile(m):
    # Its name generator reseeds only when the pid changes, and a fork's
    # pid may be the template's (both are 2 in their namespaces).
    m._name_sequence = None


# What a fork reseeds of the modules the template imported (reseed, in
# _zygote) besides the generators it finds: numpy's legacy global
# RandomState (np.random.rand, choice, shuffle, pandas' and scikit-learn's
# random_state=None), found or not, the multiprocessing authkey,
# tempfile's names. docs/sandbox.md says what a preload may still share.
_RESEED = (
    ("numpy.random", lambda m: m.seed()),
    ("multiprocessing", _reseed_multiprocessing),
    ("tempfile", _reseed_tempfile),
)


def _exit_status(e):
    # What the interpreter makes of a SystemExit that reaches it.
    code = e.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        print(code, file=sys.stderr)
    except BaseException:
        pass
    return 1


def _end(status, base):
    # A forked interpreter's end: what the end of a script's interpreter
    # does that the script can see — its threads waited for, atexit's
    # functions run, what it made and left open finalized (a file it
    # wrote and never closed is flushed), its output flushed — but not
    # the teardown of every object the template made, which would copy
    # every page this process shares with the template (some 16 ms).
    import atexit
    import gc

    threading = sys.modules.get("threading")
    if threading is not None:
        try:
            threading._shutdown()
        except BaseException:
            pass
    atexit._run_exitfuncs()
    sys.last_type = sys.last_value = sys.last_traceback = None
    made = [m for name, m in list(sys.modules.items()) if name not in base or name == "__main__"]
    for m in made:
        d = getattr(m, "__dict__", None)
        if isinstance(d, dict):
            # As the interpreter clears a module: _names first, then the rest.
            for key in [k for k in d if k.startswith("_") and not k.startswith("__")] + list(d):
                if key != "__builtins__" and key in d:
                    d[key] = None
    gc.collect()
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except BaseException:
            pass
    os._exit(status)


if _TEMPLATE:
    _serve = _driver()
    _base = _zygote()
    try:
        _serve(True)
        _status = 0
    except SystemExit as e:
        _status = _exit_status(e)
    except BaseException as e:
        sys.excepthook(type(e), e, e.__traceback__)
        _status = 1
    _end(_status, _base)
