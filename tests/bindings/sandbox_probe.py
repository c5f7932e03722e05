"""Runs inside a sandbox: checks its own lease through the Python binding (leasehold_check) and
writes what it saw to OUT as key=value lines (written whole: OUT.tmp, then renamed).

Usage: sandbox_probe.py OUT PUBLIC_KEY NAME
A sandbox started unnamed (LEASEHOLD_EPOCH=0) asks current_epoch() every 10 ms, at most
POLLS_MAX times; after its first answer (None) it creates OUT.waiting, so a test names it only
once it has seen itself unnamed. NAME is the name its token is verified for; PUBLIC_KEY is
lockd's public key. tests/bindings/goprobe does the same through the Go binding.
"""

import os
import sys
import time

import leasehold_check as lh

POLLS_MAX = 6000  # 10 ms each


def write(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.rename(path + ".tmp", path)


def probe(out, public_key, name, report):
    lease = lh.Lease.from_env()
    report.update(uid=os.getuid(), version=lh.version(), env_epoch=lease.epoch, slot=lease.slot, sandbox=lease.sandbox,
                  name_env=lease.name or "-")
    with lh.Table.open(wait_ms=1000) as table:  # None: $LEASEHOLD_SHM, the inherited descriptor
        epoch = lease.epoch
        if epoch == 0:
            first = table.current_epoch()
            report["first_answer"] = "none" if first is None else first
            write(out + ".waiting", "waiting\n")
            epoch = first
            polls = 0
            while epoch is None and polls < POLLS_MAX:
                time.sleep(0.01)
                polls += 1
                epoch = table.current_epoch()
            if epoch is None:
                raise RuntimeError(f"not named after {POLLS_MAX} polls")
        report["epoch"] = epoch
        report["check"] = int(table.check(lease.slot, epoch))
        report["check_deadline"] = int(table.check_deadline(lease.slot, epoch))
        report["check_next"] = int(table.check(lease.slot, epoch + 1))
        report["writer_alive"] = int(table.writer_alive()[0])
    with lh.Tokens.open() as tokens:  # None: $LEASEHOLD_TOKENS
        token = tokens.token(epoch)
    report["token_bytes"] = len(token)
    with lh.Verifier() as verifier:
        verifier.add_key_file(public_key)
        verifier.verify(token, name, epoch, lease.sandbox)
        report["verify"] = "ok"
        try:
            verifier.verify(token, name, epoch + 1, lease.sandbox)
            report["verify_next"] = "ok"
        except lh.LeaseholdError as e:
            report["verify_next"] = e.code


def main():
    out, public_key, name = sys.argv[1:4]
    report = {}
    try:
        probe(out, public_key, name, report)
    except Exception as e:  # the test prints the report: the reason is in it
        report["error"] = repr(e).replace("\n", " ")
    report["done"] = 1
    write(out, "".join(f"{k}={v}\n" for k, v in report.items()))
    return 1 if "error" in report else 0


if __name__ == "__main__":
    sys.exit(main())
