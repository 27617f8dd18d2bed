"""Must give crash naming SIGSEGV and line 7: the process dies by signal inside forward."""
import os
import signal


def forward(x):
    os.kill(os.getpid(), signal.SIGSEGV)
    return x
