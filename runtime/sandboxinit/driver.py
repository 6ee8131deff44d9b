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


    # Files the driver saves for the code (a figure, an image) are named
    # STEM-N.png, N from 1 in each call; in a persistent session
    # STEM-C-N.png, C the call's number in it: unique in the session, in
    # the order they were made. A name the code took is skipped.
    naming = {"call": 1, "session": False, "next": {}}

    def save(write, stem):
        os.makedirs(outputs, exist_ok=True)
        prefix = "%s-%d-" % (stem, naming["call"]) if naming["session"] else stem + "-"
        n = naming["next"].get(stem, 1)
        while True:
            path = os.path.join(outputs, "%s%d.png" % (prefix, n))
            n += 1
            try:
                f = open(path, "xb")
            except FileExistsError:
                continue
            naming["next"][stem] = n
            try:
                with f:
                    write(f)
            except BaseException:
                os.unlink(path)
                raise
            return

    def save_figure(fig):
        # Tight: nothing drawn past the figure's edge (a long tick label)
        # is cut off. Saved once: the end of the call does not save it
        # again.
        save(lambda f: fig.savefig(f, format="png", bbox_inches="tight"), "figure")
        manager = getattr(fig.canvas, "manager", None)
        if manager is not None:
            manager._saved = True

    # The sandbox's matplotlib backend (rootfs) saves what plt.show()
    # shows through this, so that its names are these.
    hooks = types.ModuleType("_mcp_exec_display")
    hooks.save_figure = save_figure
    sys.modules[hooks.__name__] = hooks

    def show_figures():
        # As a notebook's inline display does at the end of a cell: every
        # figure still open is saved (unless shown already) and closed, so
        # that a figure comes back with the call that drew it, and once.
        pyplot = sys.modules.get("matplotlib.pyplot")
        if pyplot is None:
            return
        try:
            from matplotlib._pylab_helpers import Gcf

            managers = sorted(Gcf.get_all_fig_managers(), key=lambda m: str(m.num).zfill(12))
        except BaseException:
            return
        for m in managers:
            if getattr(m, "_saved", False):
                continue
            try:
                save_figure(m.canvas.figure)
            except BaseException as e:
                print("mcp-exec: figure %s could not be saved: %s: %s" % (m.num, type(e).__name__, e), file=sys.stderr)
        try:
            pyplot.close("all")
        except BaseException:
            pass

    def viewer(module):
        # PIL's Image.show() saves the image where a desktop would open it.
        class Saver(module.Viewer):
            def show(self, image, **options):
                save(lambda f: image.save(f, format="PNG"), "image")
                return 1

        module.register(Saver, 0)

    def pandas_display(pd):
        # Results as a wide terminal shows them: a frame of a few dozen
        # columns whole (pandas fits its repr to 80 columns otherwise,
        # and hides most of them), rows as pandas' own default. The
        # code's own pd.set_option comes after, and wins.
        for key, value in (("display.width", 200), ("display.max_columns", 50), ("display.max_rows", 60)):
            try:
                pd.set_option(key, value)
            except BaseException:
                pass

    # What the driver does to a module once it is imported (here, if the
    # interpreter's start imported it already: a preload).
    after_import = {"PIL.ImageShow": viewer, "pandas": pandas_display}

    class ImportHook:
        def find_spec(self, name, path=None, target=None):
            if name not in after_import:
                return None
            import importlib.machinery

            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is None or spec.loader is None:
                return spec
            exec_module = spec.loader.exec_module

            def load(module):
                exec_module(module)
                after_import[name](module)

            spec.loader.exec_module = load
            return spec

    for name, then in after_import.items():
        if name in sys.modules:
            then(sys.modules[name])
    sys.meta_path.insert(0, ImportHook())

    def display(v):
        # An image as the last expression comes back as a file, as a
        # notebook shows it.
        mod = type(v).__module__ or ""
        if mod.startswith("matplotlib.") and hasattr(v, "figure") and hasattr(v.figure, "savefig"):
            save_figure(v.figure)
        elif mod.startswith("PIL.") and hasattr(v, "save") and hasattr(v, "mode"):
            save(lambda f: v.save(f, format="PNG"), "image")

    driver_globals = globals()

    def code_only(tb):
        # The traceback without the driver's frames: run's at the top, the
        # interrupt handler's at the bottom of a session's timeout. The
        # code's own frames (its functions, the modules it calls) are
        # never the driver's globals.
        kept = []
        while tb is not None:
            if tb.tb_frame.f_globals is not driver_globals:
                kept.append(tb)
            tb = tb.tb_next
        for a, b in zip(kept, kept[1:]):
            a.tb_next = b
        if kept:
            kept[-1].tb_next = None
        return kept[0] if kept else None

    def report(e):
        # As the interpreter reports what ended a script, but with the
        # source lines of a session's cells, which are no file: the
        # interpreter's own printer reads files only, traceback's reads
        # linecache, where each cell is. A hook of the code's is its own.
        tb = code_only(e.__traceback__)
        e = e.with_traceback(tb)
        if sys.excepthook is not sys.__excepthook__:
            sys.excepthook(type(e), e, tb)
            return
        try:
            import traceback

            traceback.print_exception(type(e), e, tb)
        except BaseException:
            sys.__excepthook__(type(e), e, tb)

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
            report(e)
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
            # The outputs dir, made here as the code's user before any code
            # is taken, rather than by a child of the init's: a process
            # creation costs several milliseconds under gVisor. (An input
            # file under it may have made it already: also the code's.)
            os.makedirs("@OUTPUTS_NAME@", 0o755, exist_ok=True)
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
            naming.update(call=n, session=bool(persist), next={})
            running = True
            try:
                status = run(source, _SCRIPT if n == 1 else "<cell %d>" % n)
            finally:
                running = False
                show_figures()
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
