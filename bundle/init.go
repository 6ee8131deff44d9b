package bundle

// initScript is the sandbox's pid 1, run by the interpreter with -I -S -c.
//
// Python as pid 1 would be an odd process: the kernel drops signals that pid
// 1 has no handler for, so os.kill(os.getpid(), SIGTERM) would do nothing,
// and orphans would pile up as zombies against the pids limit. This init
// starts the code as an ordinary child, exactly "python3 /code/main.py" with
// default signal dispositions, reaps every orphan, and exits with the code's
// status, 128+N for signal N. When it exits the kernel kills whatever the
// code left running. It also ties the container's life to the server's: if
// the server is killed, so is it, and with it every process of the
// container.
//
// It is fixed text, not the caller's code, which only ever arrives as a
// file.
const initScript = `import os, signal, sys
pid = os.posix_spawn(sys.executable, [sys.executable, "` + CodePath + `"], os.environ,
    setsigdef=signal.valid_signals())
# Die with the server. The runtime sets a parent-death signal on its own
# helper, but it does not survive the stages that create this process. Set
# after the spawn, at the lowest priority, it costs the code no time.
os.nice(19)
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
