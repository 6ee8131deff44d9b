# The driver: what the sandbox's interpreter runs (python -c DRIVER SCRIPT),
# so that the code runs as a notebook cell runs. It reads the first call's
# code from SCRIPT (the init's FIFO, then a file of that code), runs it in a
# fresh __main__, and sends the repr of a last expression to the init; in a
# persistent session it then waits for the next call on its pipe.
#
# With TEMPLATE_ARG after SCRIPT it is a template's zygote instead (see
# _zygote): it never runs a caller's code, it forks sandboxes that do.
#
# The frames and fds are runtime/initproto.go's, substituted below by name
# between at signs.
import os
import sys

_SCRIPT = sys.argv[1]
_TEMPLATE = sys.argv[2:] == ["@TEMPLATE_ARG@"]
sys.argv = [_SCRIPT]
# As for a script: its dir first on the path, not the working dir (/tmp)
# that -c puts there (nothing, under -P or PYTHONSAFEPATH).
if sys.path and sys.path[0] == "":
    sys.path[0] = os.path.dirname(os.path.abspath(_SCRIPT))


def _driver():
    # What running a call takes, made once (in a template's zygote, once
    # for all its forks); it returns serve, which runs the calls.
    import ast
    import builtins
    import linecache
    import signal
    import types

    ctl, cell = @DRIVER_CTL_FD@, @DRIVER_CELL_FD@
    outputs = os.path.join(os.environ.get("TMPDIR") or "@WORK_DIR@", "@OUTPUTS_NAME@")

    main = types.ModuleType("__main__")
    main.__file__ = _SCRIPT
    main.__builtins__ = builtins
    ns = main.__dict__

    def send(kind, payload):
        data = kind + len(payload).to_bytes(4, "big") + payload
        try:
            while data:
                data = data[os.write(ctl, data) :]
        except OSError:
            pass  # the init stopped listening: the code wrote garbage here

    def read_exact(n):
        b = b""
        while len(b) < n:
            r = os.read(cell, n - len(b))
            if not r:
                return None
            b += r
        return b

    def next_frame():
        head = read_exact(5)
        if head is None:
            return None, b""
        body = read_exact(int.from_bytes(head[1:], "big"))
        return head[:1], body or b""

    running = False

    def interrupt(signum, frame):
        # Only while a call runs: a late timeout finds the session idle.
        if running:
            raise KeyboardInterrupt


    def viewer(module):
        # PIL's Image.show() saves the image where a desktop would open it.
        class Saver(module.Viewer):
            def show(self, image, **options):
                save(lambda f: image.save(f, format="PNG"), "image")
                return 1

        module.register(Saver, 0)

    class ShowHook:
        def find_spec(self, name, path=None, target=None):
            if name != "PIL.ImageShow":
                return None
            import importlib.machinery

            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is None or spec.loader is None:
                return spec
            exec_module = spec.loader.exec_module

            def load(module):
                exec_module(module)
                viewer(module)

            spec.loader.exec_module = load
            return spec

    if "PIL.ImageShow" in sys.modules:
        viewer(sys.modules["PIL.ImageShow"])
    else:
        sys.meta_path.insert(0, ShowHook())

    def save(write, stem):
        os.makedirs(outputs, exist_ok=True)
        n = 1
        while True:
            path = os.path.join(outputs, "%s-%d.png" % (stem, n))
            n += 1
            try:
                f = open(path, "xb")
            except FileExistsError:
                continue
            with f:
                write(f)
            return

    def display(v):
        # An image as the last expression comes back as a file, as a
        # notebook shows it.
        mod = type(v).__module__ or ""
        if mod.startswith("matplotlib.") and hasattr(v, "figure") and hasattr(v.figure, "savefig"):
            fig = v.figure
            save(lambda f: fig.savefig(f, format="png", bbox_inches="tight"), "figure")
            manager = getattr(fig.canvas, "manager", None)
            if manager is not None:
                manager._saved = True
        elif mod.startswith("PIL.") and hasattr(v, "save") and hasattr(v, "mode"):
            save(lambda f: v.save(f, format="PNG"), "image")

    def run(source, filename, ns=ns):
        try:
            tree = compile(source, filename, "exec", ast.PyCF_ONLY_AST, dont_inherit=True)
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(tree.body.pop().value)
            body = compile(tree, filename, "exec", dont_inherit=True)
            if last is not None:
                last = compile(last, filename, "eval", dont_inherit=True)
        except (SyntaxError, ValueError) as e:
            # As Python reports a script it cannot compile: no traceback.
            sys.excepthook(type(e), e.with_traceback(None), None)
            return 1
        try:
            exec(body, ns)
            if last is not None:
                v = eval(last, ns)
                if v is not None:
                    display(v)
                    send(b"@D_VALUE@", repr(v).encode("utf-8", "backslashreplace")[: @MAX_FRAME@ - 1])
        except SystemExit:
            raise
        except BaseException as e:
            # The traceback starts at the code: this frame is not its.
            tb = e.__traceback__.tb_next
            sys.excepthook(type(e), e.with_traceback(tb), tb)
            return 130 if isinstance(e, KeyboardInterrupt) else 1
        return 0

    def flush():
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except BaseException:
                pass

    def options(flags):
        try:
            sys.stdout.reconfigure(line_buffering=bool(flags & @OPT_LIVE@))
        except BaseException:
            pass
        return flags & @OPT_PERSIST@

    def warm():
        # A forked interpreter shares its memory with the template until
        # it writes to it, and each page it then writes first is copied
        # (some 20 µs a page here): a call runs on pages it has made its own
        # already when a call of nothing ran first, into a namespace of its
        # own, while the sandbox waited for its call.
        run(b"None", "<warm-up>", {"__builtins__": builtins})
        sys.stdout.write("")
        flush()
        list(sys.modules.items())

    def serve(forked):
        nonlocal running
        # The code's subprocesses get neither pipe.
        os.set_inheritable(ctl, False)
        os.set_inheritable(cell, False)
        sys.modules["__main__"] = main
        if forked:
            # Confined, it says so, and waits: the init moves it into the
            # call's cgroups, checks it and says go; the sandbox's own /proc
            # and work dir are in place then. The script and the options
            # come with the call.
            send(b"@D_READY@", os.getpid().to_bytes(4, "big"))
            kind, body = next_frame()
            if kind != b"@D_GO@":
                os._exit(0)
            os.chdir("@WORK_DIR@")
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write("1000")  # the init outlives an OOM to report it
            warm()
            kind, body = next_frame()
            if kind != b"@D_OPTIONS@":
                os._exit(0)
            with open(_SCRIPT, "rb") as f:
                source = f.read()
        else:
            # Opening the script is the init's sign that the interpreter is
            # ready; the options come before the code is all in.
            with open(_SCRIPT, "rb") as f:
                source = f.read()
            kind, body = next_frame()
        persist = options(int.from_bytes(body[:4], "big")) if kind == b"@D_OPTIONS@" else 0
        if persist:
            # A session's timeout is a SIGINT; a fresh call keeps Python's
            # own handler.
            signal.signal(signal.SIGINT, interrupt)
        n = 1
        while True:
            running = True
            try:
                status = run(source, _SCRIPT if n == 1 else "<cell %d>" % n)
            finally:
                running = False
            flush()
            if not persist:
                if status:
                    sys.exit(status)
                return
            send(b"@D_DONE@", status.to_bytes(4, "big"))
            kind, body = next_frame()
            if kind != b"@D_CELL@":
                sys.exit(status)
            persist = options(int.from_bytes(body[:4], "big"))
            size = int.from_bytes(body[4:8], "big")
            stdin, source = body[8 : 8 + size], body[8 + size :]
            n += 1
            # The call's stdin, then EOF, on fd 0 for the code and its
            # children.
            try:
                fd = os.memfd_create("stdin")
                view = memoryview(stdin)
                while view:
                    view = view[os.write(fd, view) :]
                os.lseek(fd, 0, os.SEEK_SET)
                os.dup2(fd, 0)
                os.close(fd)
                sys.stdin = open(0, "r", closefd=False)
            except OSError as e:
                print("mcp-exec: this call's stdin could not be given: %s" % e, file=sys.stderr)
            text = source.decode("utf-8", "replace")
            linecache.cache["<cell %d>" % n] = (len(text), None, text.splitlines(True), "<cell %d>" % n)

    return serve


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
        # nor share a secret. CPython reseeds random itself at fork; what
        # else a preload may have seeded at import is reseeded here, from
        # the kernel's entropy, for each module the template holds. A
        # module the code imports later seeds itself in the fork.
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
            check(libc.setns(pidfd, NEWNS | NEWNET | NEWIPC | NEWUTS | NEWCGROUP), "joining the sandbox's namespaces")
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
    import ast, atexit, linecache, signal, types  # noqa: F401

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


def _reseed_multiprocessing(m):
    # Its authkey authenticates the code's own processes to each other.
    m.current_process().authkey = os.urandom(32)


def _reseed_tempfile(m):
    # Its name generator reseeds only when the pid changes, and a fork's
    # pid may be the template's (both are 2 in their namespaces).
    m._name_sequence = None


# What a fork reseeds of the modules the template imported (reseed, in
# _zygote): numpy's legacy global RandomState (np.random.rand, choice,
# shuffle, pandas' and scikit-learn's random_state=None), the
# multiprocessing authkey, tempfile's names. docs/sandbox.md says what a
# preload may still share.
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
else:
    _driver()(False)
