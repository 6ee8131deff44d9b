# The driver: what the sandbox's interpreter runs (python -c DRIVER SCRIPT),
# so that the code runs as a notebook cell runs. It reads the first call's
# code from SCRIPT (the init's FIFO, then a file of that code), runs it in a
# fresh __main__, and sends the repr of a last expression to the init; in a
# persistent session it then waits for the next call on its pipe.
#
# With TEMPLATE_ARG after SCRIPT it is a template's zygote instead: the
# runtime then runs zygote.py after this (python -c "DRIVER ZYGOTE"), which
# never runs a caller's code, it forks sandboxes that do.
#
# The frames and fds are runtime/initproto's, substituted below by name
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
            if isinstance(e, MemoryError):
                # Where the memory limit is an rlimit (the process
                # runtime), it refuses an allocation rather than kill:
                # the init reports the call as the limit's.
                send(b"@D_MEMORY@", b"")
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

    def usersite():
        # With the network on, pip installs into the sandbox's own site
        # dir (PYTHONUSERBASE, a tmpfs of its own), which is empty as the
        # interpreter starts, so site did not put it on the path: it is
        # made here, before the code, and put where site would have put
        # it (before the system's packages), so that what pip installs
        # imports at once, in this interpreter too.
        if not os.environ.get("PYTHONUSERBASE"):
            return
        import site

        if not site.ENABLE_USER_SITE:
            return
        d = site.getusersitepackages()
        try:
            os.makedirs(d, exist_ok=True)
        except OSError:
            return
        if d not in sys.path:
            at = [i for i, p in enumerate(sys.path) if p.endswith(("site-packages", "dist-packages"))]
            sys.path.insert(at[0] if at else len(sys.path), d)

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
            usersite()
            warm()
            kind, body = next_frame()
            if kind != b"@D_OPTIONS@":
                os._exit(0)
            with open(_SCRIPT, "rb") as f:
                source = f.read()
        else:
            usersite()
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


if not _TEMPLATE:
    _driver()(False)
