"""Runs a command and prints its exit status last, then exits 0: for the
self-tests whose PASS_REGULAR_EXPRESSION (which makes ctest ignore the exit
status) must also see that the command failed, e.g. `.*exit status 1$`.

    python exit_status.py COMMAND [ARGS...]
"""
import subprocess
import sys

status = subprocess.call(sys.argv[1:])
sys.stdout.flush()
print("exit status %d" % status)
