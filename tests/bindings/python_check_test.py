"""The Python binding (bindings/python/leasehold_check.py) against a table written by the
fixture writer (tests/shm/fixture_writer.cpp): sandbox 0f8fad5b-... published at epoch 42
("fixture-name", valid for 600 s), sandbox 11111111-...-2222... at epoch 7, revoked.

Usage: python_check_test.py MODULE_DIR FIXTURE_WRITER CHECK_VERSION [unittest args]
$LEASEHOLD_CHECK_LIBRARY names the library under test (the build tree's).
"""

import os
import subprocess
import sys
import tempfile
import time
import unittest
import uuid

MODULE_DIR, FIXTURE_WRITER, CHECK_VERSION = sys.argv[1:4]
del sys.argv[1:4]
sys.path.insert(0, MODULE_DIR)

import leasehold_check as lh  # noqa: E402

FIXTURE_SANDBOX = uuid.UUID("0f8fad5b-d9cb-469f-a165-70867728950e")
REVOKED_SANDBOX = uuid.UUID("11111111-1111-1111-2222-222222222222")
FIXTURE_EPOCH = 42
READY_POLLS = 500  # 10 ms each: the fixture writes its ready file within that


class Fixture:
    """One fixture writer for the whole module."""

    location = f"/dev/shm/lh-py-test-{os.getpid()}"
    slot = -1
    proc = None
    tmp = None

    @classmethod
    def start(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="lh-py-test-")
        ready = os.path.join(cls.tmp.name, "ready")
        cls.proc = subprocess.Popen([FIXTURE_WRITER, cls.location, ready, "120", "1000"])
        for _ in range(READY_POLLS):
            try:
                with open(ready) as f:
                    text = f.read()
                if text.endswith("\n"):
                    slot, epoch = (int(v) for v in text.split())
                    assert epoch == FIXTURE_EPOCH, text
                    cls.slot = slot
                    return
            except FileNotFoundError:
                pass
            time.sleep(0.01)
        raise RuntimeError(f"the fixture writer did not write {ready}")

    @classmethod
    def stop(cls):
        if cls.proc is not None:
            cls.proc.terminate()
            cls.proc.wait()
        cls.tmp.cleanup()


def setUpModule():
    Fixture.start()


def tearDownModule():
    Fixture.stop()


class TableTest(unittest.TestCase):
    def setUp(self):
        self.table = lh.Table.open(Fixture.location, wait_ms=1000)
        self.addCleanup(self.table.close)
        self.slot = Fixture.slot

    def test_version_is_the_headers(self):
        self.assertEqual(lh.version(), CHECK_VERSION)

    def test_check_is_valid_at_the_published_epoch_only(self):
        t = self.table
        self.assertEqual(t.slot_count, 16)
        self.assertIs(t.check(self.slot, FIXTURE_EPOCH), True)
        self.assertIs(t.check_deadline(self.slot, FIXTURE_EPOCH), True)
        for epoch in (0, FIXTURE_EPOCH - 1, FIXTURE_EPOCH + 1, FIXTURE_EPOCH | lh.REVOKED_BIT, 2**64 - 1):
            self.assertIs(t.check(self.slot, epoch), False, epoch)
            self.assertIs(t.check_deadline(self.slot, epoch), False, epoch)
        # Out of the C types' range: never valid (no wrap-around onto the fixture's slot or epoch).
        self.assertFalse(t.check(self.slot + 2**32, FIXTURE_EPOCH))
        self.assertFalse(t.check(self.slot, FIXTURE_EPOCH + 2**64))
        self.assertFalse(t.check(-1, FIXTURE_EPOCH))
        self.assertFalse(t.check(t.slot_count, FIXTURE_EPOCH))
        with self.assertRaises(TypeError):
            t.check(str(self.slot), FIXTURE_EPOCH)

    def test_writer_alive(self):
        alive, age_ns = self.table.writer_alive()
        self.assertIs(alive, True)
        self.assertLess(age_ns, 2**64 - 1)

    def test_snapshot_holds_the_published_fields(self):
        s = self.table.snapshot(self.slot)
        self.assertEqual((s.index, s.generation, s.state, s.revoked, s.epoch),
                         (self.slot, 1, lh.SLOT_PUBLISHED, False, FIXTURE_EPOCH))
        self.assertEqual(s.sandbox_id, FIXTURE_SANDBOX)
        self.assertEqual((s.name_bytes, s.name_prefix), (len("fixture-name"), "fixtur"))
        self.assertNotEqual(s.name_id, uuid.UUID(int=0))
        self.assertGreater(s.valid_until_ns, time.clock_gettime_ns(time.CLOCK_BOOTTIME))
        self.assertTrue(s.published)
        revoked = self.table.snapshot(self.table.find_sandbox(REVOKED_SANDBOX))
        self.assertEqual((revoked.revoked, revoked.epoch, revoked.name_prefix), (True, 7, "other"))
        self.assertFalse(revoked.published)
        self.assertNotEqual(revoked.name_id, s.name_id)
        self.assertFalse(self.table.check(revoked.index, 7))
        free = self.table.snapshot(15)  # the fixture claims two slots of 16
        self.assertEqual((free.state, free.epoch), (lh.SLOT_FREE, 0))

    def test_snapshot_of_a_slot_past_the_table(self):
        for slot in (self.table.slot_count, 2**32):
            with self.assertRaises(lh.LeaseholdError) as e:
                self.table.snapshot(slot)
            self.assertEqual(e.exception.code, lh.E_BAD_SLOT)

    def test_find_sandbox_in_any_spelling(self):
        text = str(FIXTURE_SANDBOX)
        for spelling in (text, text.upper(), text.replace("-", ""), FIXTURE_SANDBOX):
            self.assertEqual(self.table.find_sandbox(spelling), self.slot, spelling)
        with self.assertRaises(lh.LeaseholdError) as e:
            self.table.find_sandbox("0f8fad5b-d9cb-469f-a165-70867728950f")
        self.assertEqual(e.exception.code, lh.E_NOT_FOUND)
        self.assertIn("0f8fad5b-d9cb-469f-a165-70867728950f", str(e.exception))
        with self.assertRaises(lh.LeaseholdError) as e:
            self.table.find_sandbox("not-a-uuid")
        self.assertEqual(e.exception.code, lh.E_ARG)

    def test_current_epoch_only_from_its_own_published_slot(self):
        t = self.table
        self.assertEqual(t.current_epoch(self.slot, FIXTURE_SANDBOX), FIXTURE_EPOCH)
        self.assertEqual(t.current_epoch(self.slot, str(FIXTURE_SANDBOX).upper()), FIXTURE_EPOCH)
        self.assertIsNone(t.current_epoch(self.slot, REVOKED_SANDBOX))       # another sandbox's slot
        self.assertIsNone(t.current_epoch(t.find_sandbox(REVOKED_SANDBOX), REVOKED_SANDBOX))  # revoked
        self.assertIsNone(t.current_epoch(15, FIXTURE_SANDBOX))              # free
        with self.assertRaises(lh.LeaseholdError) as e:
            t.current_epoch(t.slot_count, FIXTURE_SANDBOX)
        self.assertEqual(e.exception.code, lh.E_BAD_SLOT)
        with self.assertRaises(lh.LeaseholdError) as e:
            t.current_epoch(self.slot, "nope")
        self.assertEqual(e.exception.code, lh.E_ARG)

    def test_current_epoch_defaults_to_the_environment(self):
        env = {"LEASEHOLD_SLOT": str(self.slot), "LEASEHOLD_SANDBOX": str(FIXTURE_SANDBOX)}
        with Env(env):
            self.assertEqual(self.table.current_epoch(), FIXTURE_EPOCH)
        with Env({"LEASEHOLD_SLOT": str(self.slot), "LEASEHOLD_SANDBOX": None}):
            with self.assertRaises(lh.LeaseholdError) as e:
                self.table.current_epoch()
            self.assertEqual(e.exception.code, lh.E_MISSING)

    def test_a_closed_table_answers_nothing(self):
        t = lh.Table.open(Fixture.location, wait_ms=0)
        with t:
            self.assertTrue(t.check(self.slot, FIXTURE_EPOCH))
        for call in (lambda: t.check(self.slot, FIXTURE_EPOCH), lambda: t.snapshot(self.slot), t.writer_alive):
            with self.assertRaises(lh.LeaseholdError) as e:
                call()
            self.assertEqual(e.exception.code, lh.E_ARG)
        t.close()  # twice is harmless


class Env:
    """Sets (value) or unsets (None) environment variables for a with-block."""

    def __init__(self, values):
        self.values, self.saved = values, {}

    def __enter__(self):
        for k, v in self.values.items():
            self.saved[k] = os.environ.get(k)
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class LeaseTest(unittest.TestCase):
    def env(self, **over):
        base = {"LEASEHOLD_SHM": Fixture.location, "LEASEHOLD_SLOT": str(Fixture.slot), "LEASEHOLD_EPOCH": "0",
                "LEASEHOLD_SANDBOX": str(FIXTURE_SANDBOX).upper(), "LEASEHOLD_TOKENS": "4"}
        base.update(over)
        return {k: v for k, v in base.items() if v is not None}

    def test_from_env_reads_what_the_supervisor_sets(self):
        lease = lh.Lease.from_env(self.env(LEASEHOLD_NAME="orders", LEASEHOLD_EPOCH=str(FIXTURE_EPOCH)))
        self.assertEqual(lease, lh.Lease(location=Fixture.location, slot=Fixture.slot, epoch=FIXTURE_EPOCH,
                                         sandbox=FIXTURE_SANDBOX, name="orders", tokens="4"))
        with lease.open(wait_ms=0) as t:
            self.assertTrue(t.check_deadline(lease.slot, lease.epoch))

    def test_started_unnamed_learns_its_epoch_from_its_slot(self):
        lease = lh.Lease.from_env(self.env())
        self.assertEqual((lease.epoch, lease.name), (0, None))
        with lease.open() as t:
            self.assertFalse(t.check(lease.slot, lease.epoch))
            self.assertEqual(t.current_epoch(lease.slot, lease.sandbox), FIXTURE_EPOCH)

    def test_from_env_names_what_is_missing_or_malformed(self):
        for over, code in (({"LEASEHOLD_SHM": None}, lh.E_MISSING), ({"LEASEHOLD_SLOT": None}, lh.E_MISSING),
                           ({"LEASEHOLD_SLOT": "x"}, lh.E_ARG), ({"LEASEHOLD_SLOT": str(2**32)}, lh.E_ARG),
                           ({"LEASEHOLD_EPOCH": "-1"}, lh.E_ARG), ({"LEASEHOLD_EPOCH": "\u00b2"}, lh.E_ARG),
                           ({"LEASEHOLD_SANDBOX": None}, lh.E_MISSING), ({"LEASEHOLD_SANDBOX": "x"}, lh.E_ARG)):
            with self.assertRaises(lh.LeaseholdError, msg=over) as e:
                lh.Lease.from_env(self.env(**over))
            self.assertEqual(e.exception.code, code, over)
            self.assertIn(next(iter(over)), e.exception.message)


class ErrorsTest(unittest.TestCase):
    def test_a_missing_table(self):
        missing = f"/dev/shm/lh-py-missing-{os.getpid()}"
        with self.assertRaises(lh.LeaseholdError) as e:
            lh.Table.open(missing, wait_ms=0)
        self.assertEqual(e.exception.code, lh.E_MISSING)
        self.assertIn(missing, e.exception.message)
        self.assertIn("table missing", str(e.exception))
        with Env({"LEASEHOLD_SHM": None}):
            with self.assertRaises(lh.LeaseholdError) as e:
                lh.Table.open(wait_ms=0)
            self.assertEqual(e.exception.code, lh.E_MISSING)

    def test_a_file_that_is_not_a_table(self):
        with tempfile.NamedTemporaryFile(prefix="lh-py-junk-") as f:
            f.write(b"x" * 8192)
            f.flush()
            with self.assertRaises(lh.LeaseholdError) as e:
                lh.Table.open(f.name, wait_ms=0)
            self.assertEqual(e.exception.code, lh.E_BAD_MAGIC)
        with self.assertRaises(lh.LeaseholdError) as e:
            lh.Table.open("/dev/shm/a\0b", wait_ms=0)
        self.assertEqual(e.exception.code, lh.E_ARG)

    def test_tokens_need_the_channel(self):
        with Env({"LEASEHOLD_TOKENS": None}):
            with self.assertRaises(lh.LeaseholdError) as e:
                lh.Tokens.open()
            self.assertEqual(e.exception.code, lh.E_MISSING)
        with self.assertRaises(lh.LeaseholdError) as e:
            lh.Tokens.open("x")
        self.assertEqual(e.exception.code, lh.E_ARG)

    def test_the_verifier_refuses_what_is_not_a_signed_token(self):
        holder = str(FIXTURE_SANDBOX)
        with lh.Verifier() as v:
            cases = ((lambda: v.add_key(b"short"), lh.E_ARG),
                     (lambda: v.add_key_file("/nonexistent/lockd.pub"), lh.E_IO),
                     (lambda: v.verify(b"", "orders", 3, holder), lh.E_TOKEN_UNSIGNED),
                     (lambda: v.verify(bytes(lh.TOKEN_BYTES), "orders", 3, holder), lh.E_TOKEN_MALFORMED),
                     (lambda: v.verify(bytes(lh.TOKEN_BYTES), "bad name!", 3, holder), lh.E_ARG),
                     (lambda: v.verify(bytes(lh.TOKEN_BYTES), "orders", 3, "nope"), lh.E_ARG),
                     (lambda: v.verify(bytes(lh.TOKEN_BYTES), "orders", -1, holder), lh.E_ARG))
            for call, code in cases:
                with self.assertRaises(lh.LeaseholdError) as e:
                    call()
                self.assertEqual(e.exception.code, code)
                self.assertNotEqual(e.exception.message, "")
        with self.assertRaises(lh.LeaseholdError) as e:
            v.verify(b"", "orders", 3, holder)
        self.assertEqual(e.exception.code, lh.E_ARG)  # closed

    def test_strerror_is_the_librarys(self):
        self.assertEqual(lh.strerror(lh.E_MISSING), "table missing")
        self.assertEqual(lh.strerror(lh.E_TOKEN_WRONG_EPOCH), "token of another epoch")
        self.assertEqual(lh.strerror(2**40), "unknown leasehold error")

    def test_a_library_that_cannot_be_loaded(self):
        code = ("import leasehold_check as lh\n"
                "try:\n    lh.version()\n"
                "except lh.LeaseholdError as e:\n    print(e.code, e.message)\n")
        env = dict(os.environ, LEASEHOLD_CHECK_LIBRARY="/nonexistent/libleasehold-check.so.1",
                   PYTHONPATH=MODULE_DIR)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        self.assertTrue(out.stdout.startswith(f"{lh.E_MISSING} cannot load /nonexistent/libleasehold-check.so.1"),
                        out.stdout + out.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
