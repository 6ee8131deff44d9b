package bundle

// initScript is the sandbox's pid 1, run by the interpreter with -c.
//
// Python as pid 1 would be an odd process: the kernel drops signals that pid
// 1 has no handler for, so os.kill(os.getpid(), SIGTERM) would do nothing,
// and orphans would pile up as zombies against the pids limit. This init
// forks the code into a child, where it runs as the script __main__ of
// /code/main.py exactly as "python3 /code/main.py" would run it (sys.argv,
// sys.path[0], __file__, tracebacks without this wrapper's frame), reaps
// every orphan, and exits with the code's status, 128+N for signal N. When
// it exits the kernel kills whatever the code left running. It also ties
// the container's life to the server's: if the server is killed, so is it,
// and with it every process of the container.
//
// It is fixed text, not the caller's code, which only ever arrives as a
// file.
const initScript = `import os, sys
pid = os.fork()
if pid == 0:
    import types
    path = "` + CodePath + `"
    sys.argv[:] = [path]
    sys.path[0] = "` + CodeDir + `"
    main = types.ModuleType("__main__")
    main.__file__ = path
    sys.modules["__main__"] = main
    def _hook(t, v, tb, _orig=sys.excepthook):
        if tb is not None and tb.tb_frame.f_code.co_filename == "<string>":
            tb = tb.tb_next
            v = v.with_traceback(tb)
        _orig(t, v, tb)
    sys.excepthook = _hook
    del types, _hook
    with open(path, "rb") as f:
        src = f.read()
    del f
    exec(compile(src, path, "exec"), main.__dict__)
else:
    # Die with the server. The runtime sets a parent-death signal on its
    # own helper, but it does not survive the stages that create this
    # process; set after the fork, it costs the code no start-up time.
    import ctypes
    ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
    status = 0
    while True:
        try:
            p, st = os.wait()
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        if p == pid:
            status = os.waitstatus_to_exitcode(st)
            break
    os._exit(128 - status if status < 0 else status)
`
