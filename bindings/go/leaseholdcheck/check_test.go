package leaseholdcheck

// Against a table written by the project's fixture writer (tests/shm/fixture_writer.cpp):
// LEASEHOLD_TEST_FIXTURE_WRITER names it (tests/bindings/go_test.sh sets it; without it these
// tests skip). The fixture publishes sandbox 0f8fad5b-... at epoch 42 ("fixture-name", valid
// for 600 s) and sandbox 11111111-...-2222... at epoch 7, revoked.

import (
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

const (
	fixtureSandbox = "0f8fad5b-d9cb-469f-a165-70867728950e"
	revokedSandbox = "11111111-1111-1111-2222-222222222222"
	fixtureEpoch   = 42
	readyPolls     = 500 // 10 ms each: the fixture writes its ready file within that
)

type fixture struct {
	location string
	slot     uint32
	cmd      *exec.Cmd
}

func startFixture(t *testing.T) *fixture {
	t.Helper()
	writer := os.Getenv("LEASEHOLD_TEST_FIXTURE_WRITER")
	if writer == "" {
		t.Skip("LEASEHOLD_TEST_FIXTURE_WRITER is not set (tests/bindings/go_test.sh sets it)")
	}
	dir := t.TempDir()
	f := &fixture{location: fmt.Sprintf("/dev/shm/lh-go-test-%d-%s", os.Getpid(), strings.ReplaceAll(t.Name(), "/", "-"))}
	ready := filepath.Join(dir, "ready")
	f.cmd = exec.Command(writer, f.location, ready, "60", "1000")
	f.cmd.Stderr = os.Stderr
	if err := f.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", writer, err)
	}
	t.Cleanup(func() {
		_ = f.cmd.Process.Signal(syscall.SIGTERM)
		_ = f.cmd.Wait()
		_ = os.Remove(f.location)
	})
	for i := 0; ; i++ {
		if b, err := os.ReadFile(ready); err == nil && strings.HasSuffix(string(b), "\n") {
			var epoch uint64
			if _, err := fmt.Sscanf(string(b), "%d %d", &f.slot, &epoch); err != nil || epoch != fixtureEpoch {
				t.Fatalf("ready file %q: %v", b, err)
			}
			return f
		}
		if i == readyPolls {
			t.Fatalf("the fixture writer did not write %s", ready)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func wantCode(t *testing.T, err error, code Code) {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("want an *Error with code %d (%s), got %v", code, code, err)
	}
	if e.Code != code {
		t.Fatalf("want code %d (%s), got %d: %v", code, code, e.Code, err)
	}
	if e.Message == "" || !strings.Contains(err.Error(), e.Message) {
		t.Fatalf("error %q lacks its message %q", err.Error(), e.Message)
	}
}

func TestVersionIsTheHeaders(t *testing.T) {
	want := os.Getenv("LEASEHOLD_TEST_CHECK_VERSION")
	if want == "" {
		t.Skip("LEASEHOLD_TEST_CHECK_VERSION is not set")
	}
	if got := Version(); got != want {
		t.Fatalf("Version() = %q, check.h says %q", got, want)
	}
}

func TestCheckAtThePublishedEpochOnly(t *testing.T) {
	f := startFixture(t)
	table, err := Open(f.location, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer table.Close()
	if n := table.SlotCount(); n != 16 {
		t.Fatalf("SlotCount() = %d, the fixture makes 16", n)
	}
	if !table.Check(f.slot, fixtureEpoch) || !table.CheckDeadline(f.slot, fixtureEpoch) {
		t.Fatalf("slot %d at epoch %d: not valid", f.slot, fixtureEpoch)
	}
	for _, e := range []uint64{0, fixtureEpoch - 1, fixtureEpoch + 1, fixtureEpoch | 1<<63, math.MaxUint64} {
		if table.Check(f.slot, e) || table.CheckDeadline(f.slot, e) {
			t.Errorf("slot %d valid at epoch %d", f.slot, e)
		}
	}
	if table.Check(table.SlotCount(), fixtureEpoch) {
		t.Error("a slot past the table is valid")
	}
	alive, age := table.WriterAlive()
	if !alive || age == math.MaxUint64 {
		t.Errorf("WriterAlive() = %v, %d: the fixture heartbeats", alive, age)
	}
	table.Close()
	if table.Check(f.slot, fixtureEpoch) || table.CheckDeadline(f.slot, fixtureEpoch) {
		t.Error("a closed table answers valid")
	}
	_, err = table.Snapshot(f.slot)
	wantCode(t, err, ErrArg)
}

func TestSnapshotHoldsThePublishedFields(t *testing.T) {
	f := startFixture(t)
	table, err := Open(f.location, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer table.Close()
	s, err := table.Snapshot(f.slot)
	if err != nil {
		t.Fatal(err)
	}
	if s.Index != f.slot || s.Generation != 1 || s.State != SlotPublished || s.Revoked || s.Epoch != fixtureEpoch ||
		s.Sandbox.String() != fixtureSandbox || s.NameBytes != uint32(len("fixture-name")) || s.NamePrefix != "fixtur" ||
		!s.Published() {
		t.Fatalf("snapshot %+v", s)
	}
	if s.NameID == (UUID{}) || s.ValidUntilNs == 0 {
		t.Fatalf("snapshot %+v: no name id or deadline", s)
	}
	rs, err := table.FindSandbox(revokedSandbox)
	if err != nil {
		t.Fatal(err)
	}
	r, err := table.Snapshot(rs)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Revoked || r.Epoch != 7 || r.Published() || r.NamePrefix != "other" || r.NameID == s.NameID {
		t.Fatalf("revoked slot %+v", r)
	}
	if table.Check(rs, 7) {
		t.Fatal("the revoked slot is valid at its epoch")
	}
	_, err = table.Snapshot(table.SlotCount())
	wantCode(t, err, ErrBadSlot)
}

func TestFindSandboxAcceptsAnySpellingAndNamesWhatIsMissing(t *testing.T) {
	f := startFixture(t)
	table, err := Open(f.location, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer table.Close()
	for _, id := range []string{fixtureSandbox, strings.ToUpper(fixtureSandbox), strings.ReplaceAll(fixtureSandbox, "-", "")} {
		if slot, err := table.FindSandbox(id); err != nil || slot != f.slot {
			t.Errorf("FindSandbox(%s) = %d, %v; want %d", id, slot, err, f.slot)
		}
	}
	_, err = table.FindSandbox("0f8fad5b-d9cb-469f-a165-70867728950f")
	wantCode(t, err, ErrNotFound)
	_, err = table.FindSandbox("not-a-uuid")
	wantCode(t, err, ErrArg)
}

func TestCurrentEpochOnlyFromItsOwnPublishedSlot(t *testing.T) {
	f := startFixture(t)
	table, err := Open(f.location, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer table.Close()
	own, _ := ParseUUID(fixtureSandbox)
	other, _ := ParseUUID(revokedSandbox)
	if e, ok, err := table.CurrentEpoch(f.slot, own); err != nil || !ok || e != fixtureEpoch {
		t.Fatalf("own slot: %d, %v, %v; want %d", e, ok, err, fixtureEpoch)
	}
	if e, ok, err := table.CurrentEpoch(f.slot, other); err != nil || ok || e != 0 {
		t.Fatalf("another sandbox's slot: %d, %v, %v", e, ok, err)
	}
	rs, _ := table.FindSandbox(revokedSandbox)
	if e, ok, err := table.CurrentEpoch(rs, other); err != nil || ok || e != 0 {
		t.Fatalf("its own revoked slot: %d, %v, %v", e, ok, err)
	}
	free := uint32(15) // the fixture claims two slots of 16
	if e, ok, err := table.CurrentEpoch(free, own); err != nil || ok || e != 0 {
		t.Fatalf("a free slot: %d, %v, %v", e, ok, err)
	}
	_, _, err = table.CurrentEpoch(table.SlotCount(), own)
	wantCode(t, err, ErrBadSlot)
}

func TestLeaseFromEnv(t *testing.T) {
	f := startFixture(t)
	t.Setenv("LEASEHOLD_SHM", f.location)
	t.Setenv("LEASEHOLD_SLOT", fmt.Sprint(f.slot))
	t.Setenv("LEASEHOLD_EPOCH", "0")
	t.Setenv("LEASEHOLD_SANDBOX", strings.ToUpper(fixtureSandbox))
	t.Setenv("LEASEHOLD_NAME", "")
	t.Setenv("LEASEHOLD_TOKENS", "4")
	l, err := LeaseFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	if l.Location != f.location || l.Slot != f.slot || l.Epoch != 0 || l.Sandbox.String() != fixtureSandbox ||
		l.Name != "" || l.Tokens != "4" {
		t.Fatalf("lease %+v", l)
	}
	table, err := l.Open(time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer table.Close()
	// Started unnamed: the epoch comes from its own slot.
	if e, ok, err := table.CurrentEpoch(l.Slot, l.Sandbox); err != nil || !ok || e != fixtureEpoch {
		t.Fatalf("CurrentEpoch: %d, %v, %v", e, ok, err)
	}
	// "" is $LEASEHOLD_SHM.
	viaEnv, err := Open("", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer viaEnv.Close()
	if !viaEnv.Check(l.Slot, fixtureEpoch) {
		t.Fatal("the table of $LEASEHOLD_SHM does not hold the fixture's lease")
	}
	for _, c := range []struct {
		key, value string
		code       Code
	}{
		{"LEASEHOLD_SLOT", "", ErrMissing},
		{"LEASEHOLD_SLOT", "x", ErrArg},
		{"LEASEHOLD_SLOT", "4294967296", ErrArg},
		{"LEASEHOLD_EPOCH", "-1", ErrArg},
		{"LEASEHOLD_SANDBOX", "nope", ErrArg},
		{"LEASEHOLD_SANDBOX", "", ErrMissing},
		{"LEASEHOLD_SHM", "", ErrMissing},
	} {
		old := os.Getenv(c.key)
		os.Setenv(c.key, c.value)
		_, err := LeaseFromEnv()
		os.Setenv(c.key, old)
		wantCode(t, err, c.code)
	}
}

func TestMissingOrForeignTables(t *testing.T) {
	missing := fmt.Sprintf("/dev/shm/lh-go-missing-%d", os.Getpid())
	_, err := Open(missing, 0)
	wantCode(t, err, ErrMissing)
	if !strings.Contains(err.Error(), missing) {
		t.Errorf("%v does not name %s", err, missing)
	}
	t.Setenv("LEASEHOLD_SHM", "")
	_, err = Open("", 0)
	wantCode(t, err, ErrMissing)
	junk := filepath.Join(t.TempDir(), "junk")
	if err := os.WriteFile(junk, []byte(strings.Repeat("x", 8192)), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = Open(junk, 0)
	wantCode(t, err, ErrBadMagic)
	_, err = Open("/dev/shm/a\x00b", 0)
	wantCode(t, err, ErrArg)
	_, err = Open(missing, -time.Second)
	wantCode(t, err, ErrArg)
}

func TestTokensAndVerifierRefuseWhatIsNotAToken(t *testing.T) {
	t.Setenv("LEASEHOLD_TOKENS", "")
	_, err := OpenTokens("")
	wantCode(t, err, ErrMissing)
	_, err = OpenTokens("x")
	wantCode(t, err, ErrArg)
	v, err := NewVerifier()
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	wantCode(t, v.AddKey([]byte("short")), ErrArg)
	wantCode(t, v.AddKeyFile(filepath.Join(t.TempDir(), "no-such.pub")), ErrIO)
	wantCode(t, v.Verify(nil, "orders", 3, fixtureSandbox), ErrTokenUnsigned)
	wantCode(t, v.Verify(make([]byte, TokenBytes), "orders", 3, fixtureSandbox), ErrTokenMalformed)
	wantCode(t, v.Verify(make([]byte, TokenBytes), "bad name!", 3, fixtureSandbox), ErrArg)
	wantCode(t, v.Verify(make([]byte, TokenBytes), "orders", 3, "not-a-uuid"), ErrArg)
	if ErrMissing.String() != "table missing" || CodeOf(nil) != OK || CodeOf(errors.New("x")) != ErrIO {
		t.Fatal("Code texts")
	}
}
