// Package leaseholdcheck is a sandbox's check of its own lease, for Go runtimes: cgo over
// libleasehold-check (include/leasehold/check.h, the library's C ABI).
//
// The supervisor starts every sandbox with its lease in the environment: LEASEHOLD_SHM (the shm
// epoch table: "3", an inherited read-only descriptor, or a path), LEASEHOLD_SLOT (its slot),
// LEASEHOLD_EPOCH (its name's epoch; 0 when started unnamed), LEASEHOLD_SANDBOX (its id),
// LEASEHOLD_NAME (its name, when started named) and LEASEHOLD_TOKENS (its token channel, "4").
//
//	lease, err := leaseholdcheck.LeaseFromEnv()
//	table, err := leaseholdcheck.Open("", time.Second) // "": $LEASEHOLD_SHM
//	defer table.Close()
//	epoch := lease.Epoch
//	if epoch == 0 { // started unnamed: its own slot tells the epoch once it is named
//		epoch, _, err = table.CurrentEpoch(lease.Slot, lease.Sandbox)
//	}
//	if epoch == 0 || !table.CheckDeadline(lease.Slot, epoch) { /* not the holder: no side effect */ }
//
// Errors are *Error: Code is the library's LEASEHOLD_E_* value, Message its message. A Table, a
// Tokens and a Verifier may be used from several goroutines (the library is thread-safe); Close
// must not run concurrently with their other calls. Each check is one cgo call (tens of ns).
//
// Build: the package finds the library with pkg-config (package libleasehold-check-dev, or
// PKG_CONFIG_PATH pointing at an installed build's lib/pkgconfig). See bindings/README.md.
package leaseholdcheck

/*
#cgo pkg-config: leasehold-check
#include <stdlib.h>
#include <leasehold/check.h>
*/
import "C"

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"time"
	"unsafe"
)

// Code is a LEASEHOLD_E_* value of check.h (negative; OK is 0).
type Code int

// The library's codes (check.h).
const (
	OK                   Code = C.LEASEHOLD_OK
	ErrMissing           Code = C.LEASEHOLD_E_MISSING   // no table at the location (or LEASEHOLD_SHM unset)
	ErrTruncated         Code = C.LEASEHOLD_E_TRUNCATED // file smaller than its header says
	ErrBadMagic          Code = C.LEASEHOLD_E_BAD_MAGIC // not a leasehold table
	ErrVersion           Code = C.LEASEHOLD_E_VERSION   // incompatible layout major version
	ErrGeometry          Code = C.LEASEHOLD_E_GEOMETRY  // inconsistent header
	ErrNotReady          Code = C.LEASEHOLD_E_NOT_READY // the writer has not finished creating it
	ErrBadSlot           Code = C.LEASEHOLD_E_BAD_SLOT  // slot index out of range
	ErrNotFound          Code = C.LEASEHOLD_E_NOT_FOUND // no slot for that sandbox (no token for that epoch)
	ErrIO                Code = C.LEASEHOLD_E_IO        // the OS refused (permission, ...)
	ErrArg               Code = C.LEASEHOLD_E_ARG       // malformed argument
	ErrBusy              Code = C.LEASEHOLD_E_BUSY      // slot kept changing; retry
	ErrTokenUnsigned     Code = C.LEASEHOLD_E_TOKEN_UNSIGNED
	ErrTokenMalformed    Code = C.LEASEHOLD_E_TOKEN_MALFORMED
	ErrTokenUnknownKey   Code = C.LEASEHOLD_E_TOKEN_UNKNOWN_KEY
	ErrTokenBadSignature Code = C.LEASEHOLD_E_TOKEN_BAD_SIGNATURE
	ErrTokenWrongName    Code = C.LEASEHOLD_E_TOKEN_WRONG_NAME
	ErrTokenWrongEpoch   Code = C.LEASEHOLD_E_TOKEN_WRONG_EPOCH
	ErrTokenWrongHolder  Code = C.LEASEHOLD_E_TOKEN_WRONG_HOLDER
)

// TokenBytes is the length of a signed fencing token.
const TokenBytes = C.LEASEHOLD_TOKEN_BYTES

// String is the library's stable text of the code (leasehold_strerror).
func (c Code) String() string {
	if c < math.MinInt32 || c > math.MaxInt32 {
		return "unknown leasehold error"
	}
	return C.GoString(C.leasehold_strerror(C.int(c)))
}

// Error is a libleasehold-check error.
type Error struct {
	Code    Code
	Message string
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s (%s, code %d)", e.Message, e.Code, int(e.Code))
}

// CodeOf is err's Code when err is (or wraps) an *Error, else OK for nil and ErrIO otherwise.
func CodeOf(err error) Code {
	if err == nil {
		return OK
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ErrIO
}

const errBytes = 512 // room for the library's messages

func fail(rc C.int, msg []byte, what string) error {
	text := ""
	if msg != nil {
		if n := bytes.IndexByte(msg, 0); n >= 0 {
			text = string(msg[:n])
		}
	}
	if text == "" {
		text = what + ": " + Code(rc).String()
	}
	return &Error{Code: Code(rc), Message: text}
}

func errbuf() ([]byte, *C.char) {
	b := make([]byte, errBytes)
	return b, (*C.char)(unsafe.Pointer(&b[0]))
}

// cstring is s as a C string (nil for ""), freed by the caller with free(); a NUL inside is
// refused (the C side would cut the text there).
func cstring(s, what string) (*C.char, error) {
	if s == "" {
		return nil, nil
	}
	if strings.IndexByte(s, 0) >= 0 {
		return nil, &Error{Code: ErrArg, Message: what + " contains a NUL byte"}
	}
	return C.CString(s), nil
}

// Version is the loaded library's version, "MAJOR.MINOR.PATCH" (leasehold_check_version).
func Version() string { return C.GoString(C.leasehold_check_version()) }

// ---- ids --------------------------------------------------------------------------------------

// UUID is a sandbox or name id (16 bytes, big-endian, as in the table).
type UUID [16]byte

// ParseUUID reads UUID text in any case, dashes optional.
func ParseUUID(s string) (UUID, error) {
	var u UUID
	h := strings.ReplaceAll(s, "-", "")
	if len(h) != 32 {
		return u, &Error{Code: ErrArg, Message: fmt.Sprintf("%q is not a UUID", s)}
	}
	if _, err := hex.Decode(u[:], []byte(h)); err != nil {
		return u, &Error{Code: ErrArg, Message: fmt.Sprintf("%q is not a UUID", s)}
	}
	return u, nil
}

// String is the UUID's canonical text (lower case, dashed).
func (u UUID) String() string {
	h := hex.EncodeToString(u[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// ---- the lease in the environment -------------------------------------------------------------

// Lease is a sandbox's lease as its supervisor gave it (the environment at start). Epoch is 0
// for a sandbox started unnamed: named later, it learns its epoch from its own slot
// (Table.CurrentEpoch). Name is "" then too (LEASEHOLD_NAME is set only at start).
type Lease struct {
	Location string // LEASEHOLD_SHM
	Slot     uint32 // LEASEHOLD_SLOT
	Epoch    uint64 // LEASEHOLD_EPOCH (0: started unnamed)
	Sandbox  UUID   // LEASEHOLD_SANDBOX
	Name     string // LEASEHOLD_NAME
	Tokens   string // LEASEHOLD_TOKENS
}

func envUint(key string, bits int) (uint64, error) {
	raw := os.Getenv(key)
	if raw == "" {
		return 0, &Error{Code: ErrMissing, Message: key + " is not set (the supervisor sets it in every sandbox it starts)"}
	}
	v, err := strconv.ParseUint(raw, 10, bits)
	if err != nil || raw[0] == '+' {
		return 0, &Error{Code: ErrArg, Message: fmt.Sprintf("%s=%q is not a %d-bit number", key, raw, bits)}
	}
	return v, nil
}

// LeaseFromEnv reads the lease from the environment: ErrMissing when a variable is unset,
// ErrArg when one is malformed.
func LeaseFromEnv() (Lease, error) {
	var l Lease
	l.Location = os.Getenv("LEASEHOLD_SHM")
	if l.Location == "" {
		return l, &Error{Code: ErrMissing, Message: "LEASEHOLD_SHM is not set: not started by a leasehold supervisor"}
	}
	slot, err := envUint("LEASEHOLD_SLOT", 32)
	if err != nil {
		return l, err
	}
	epoch, err := envUint("LEASEHOLD_EPOCH", 63)
	if err != nil {
		return l, err
	}
	raw := os.Getenv("LEASEHOLD_SANDBOX")
	if raw == "" {
		return l, &Error{Code: ErrMissing, Message: "LEASEHOLD_SANDBOX is not set (the supervisor sets it in every sandbox it starts)"}
	}
	if l.Sandbox, err = ParseUUID(raw); err != nil {
		return l, &Error{Code: ErrArg, Message: fmt.Sprintf("LEASEHOLD_SANDBOX=%q is not a UUID", raw)}
	}
	l.Slot, l.Epoch = uint32(slot), epoch
	l.Name = os.Getenv("LEASEHOLD_NAME")
	l.Tokens = os.Getenv("LEASEHOLD_TOKENS")
	return l, nil
}

// Open opens the table of this lease (Open(l.Location, wait)).
func (l Lease) Open(wait time.Duration) (*Table, error) { return Open(l.Location, wait) }

// ---- the table --------------------------------------------------------------------------------

// SlotState is a slot's lifecycle (check.h LEASEHOLD_SLOT_*).
type SlotState uint32

// Slot states.
const (
	SlotFree      SlotState = C.LEASEHOLD_SLOT_FREE
	SlotClaimed   SlotState = C.LEASEHOLD_SLOT_CLAIMED
	SlotPublished SlotState = C.LEASEHOLD_SLOT_PUBLISHED
	SlotCooling   SlotState = C.LEASEHOLD_SLOT_COOLING
	SlotUnknown   SlotState = C.LEASEHOLD_SLOT_UNKNOWN // a state this library does not know: rely on nothing
)

// SlotInfo is a consistent copy of one slot (leasehold_slot_info).
type SlotInfo struct {
	Index        uint32
	Generation   uint32 // +1 each time the slot is claimed
	State        SlotState
	Revoked      bool
	Epoch        uint64 // 0: none published
	Sandbox      UUID
	NameID       UUID
	ValidUntilNs uint64 // CLOCK_BOOTTIME
	NameBytes    uint32 // the name's full length
	NamePrefix   string // its first bytes
}

// Published says the slot holds a live grant's epoch: published and not revoked.
func (s SlotInfo) Published() bool { return s.State == SlotPublished && !s.Revoked && s.Epoch > 0 }

// Table is a read-only mapping of a supervisor's shm epoch table.
type Table struct {
	t *C.leasehold_table
}

// Open opens the table at location (a descriptor number such as "3", a shm name, or an
// absolute path; "" means $LEASEHOLD_SHM), waiting up to wait (millisecond resolution) for it
// to appear and become ready.
func Open(location string, wait time.Duration) (*Table, error) {
	ms := wait / time.Millisecond
	if ms < 0 || ms > math.MaxUint32 {
		return nil, &Error{Code: ErrArg, Message: fmt.Sprintf("wait %v outside [0, %d ms]", wait, uint32(math.MaxUint32))}
	}
	loc, err := cstring(location, "location")
	if err != nil {
		return nil, err
	}
	defer C.free(unsafe.Pointer(loc))
	msg, cmsg := errbuf()
	var t *C.leasehold_table
	if rc := C.leasehold_open(loc, C.uint32_t(ms), &t, cmsg, C.size_t(len(msg))); rc != C.LEASEHOLD_OK {
		return nil, fail(rc, msg, "leasehold_open")
	}
	return &Table{t: t}, nil
}

// Close unmaps the table; later checks answer false and other calls ErrArg.
func (t *Table) Close() error {
	if t.t != nil {
		C.leasehold_close(t.t)
		t.t = nil
	}
	return nil
}

func (t *Table) closed() error { return &Error{Code: ErrArg, Message: "the table is closed"} }

// SlotCount is the number of slots (0 once closed).
func (t *Table) SlotCount() uint32 { return uint32(C.leasehold_slot_count(t.t)) }

// Check is true when slot holds epoch (published, not revoked): one load and a compare, no
// clock, so it cannot see a dead writer or a passed deadline (CheckDeadline can).
func (t *Table) Check(slot uint32, epoch uint64) bool {
	return t.t != nil && C.leasehold_check_slot(t.t, C.uint32_t(slot), C.uint64_t(epoch)) == 1
}

// CheckDeadline is Check, and: its valid-until not passed, the writer's heartbeat fresh, the
// table not closed. Call it before every side effect that must be fenced.
func (t *Table) CheckDeadline(slot uint32, epoch uint64) bool {
	return t.t != nil && C.leasehold_check_deadline(t.t, C.uint32_t(slot), C.uint64_t(epoch)) == 1
}

// WriterAlive says whether the supervisor's heartbeat is fresh, and its age in ns
// (math.MaxUint64 when there is none).
func (t *Table) WriterAlive() (alive bool, ageNs uint64) {
	var age C.uint64_t
	ok := C.leasehold_writer_alive(t.t, &age) == 1
	return ok, uint64(age)
}

// Snapshot is a consistent copy of slot: ErrBadSlot or ErrBusy otherwise.
func (t *Table) Snapshot(slot uint32) (SlotInfo, error) {
	if t.t == nil {
		return SlotInfo{}, t.closed()
	}
	var c C.leasehold_slot_info
	if rc := C.leasehold_snapshot(t.t, C.uint32_t(slot), &c); rc != C.LEASEHOLD_OK {
		return SlotInfo{}, fail(rc, nil, fmt.Sprintf("leasehold_snapshot(slot %d)", slot))
	}
	s := SlotInfo{
		Index:        uint32(c.index),
		Generation:   uint32(c.generation),
		State:        SlotState(c.state),
		Revoked:      c.revoked != 0,
		Epoch:        uint64(c.epoch),
		ValidUntilNs: uint64(c.valid_until_ns),
		NameBytes:    uint32(c.name_bytes),
		NamePrefix:   C.GoString(&c.name_prefix[0]),
	}
	for i := 0; i < 16; i++ {
		s.Sandbox[i] = byte(c.sandbox_id[i])
		s.NameID[i] = byte(c.name_id[i])
	}
	return s, nil
}

// FindSandbox is the slot of a sandbox (UUID text, any case, dashes optional): ErrNotFound
// when it has none, ErrArg when the text is no UUID.
func (t *Table) FindSandbox(sandbox string) (uint32, error) {
	if t.t == nil {
		return 0, t.closed()
	}
	id, err := cstring(sandbox, "sandbox id")
	if err != nil {
		return 0, err
	}
	if id == nil {
		return 0, &Error{Code: ErrArg, Message: "leasehold_find_sandbox: empty sandbox id"}
	}
	defer C.free(unsafe.Pointer(id))
	rc := C.leasehold_find_sandbox(t.t, id)
	if rc < 0 {
		return 0, fail(C.int(rc), nil, fmt.Sprintf("leasehold_find_sandbox(%s)", sandbox))
	}
	return uint32(rc), nil
}

// CurrentEpoch is the epoch published in this sandbox's own slot: (epoch, true) only when the
// slot's sandbox id is sandbox and the slot is published and not revoked; (0, false) otherwise
// (not named yet, revoked, or another sandbox's slot); an error when the slot cannot be read.
//
// For a sandbox started unnamed (LEASEHOLD_EPOCH=0): the slot is its own from start to exit, so
// an epoch published there is the grant of its name. Learn it once, then check that epoch
// (Check, CheckDeadline) and present it as the fencing token; do not re-read it before each
// check: the check is against the grant it learnt (bindings/README.md).
func (t *Table) CurrentEpoch(slot uint32, sandbox UUID) (uint64, bool, error) {
	s, err := t.Snapshot(slot)
	if err != nil {
		return 0, false, err
	}
	if s.Sandbox != sandbox || !s.Published() {
		return 0, false, nil
	}
	return s.Epoch, true, nil
}

// ---- tokens and their verification ------------------------------------------------------------

// Tokens is the sandbox's own token channel: the signed tokens of its grants.
type Tokens struct {
	t *C.leasehold_tokens
}

// OpenTokens opens the token channel at location (the inherited descriptor's number, "4"; ""
// means $LEASEHOLD_TOKENS): ErrMissing when unset.
func OpenTokens(location string) (*Tokens, error) {
	loc, err := cstring(location, "location")
	if err != nil {
		return nil, err
	}
	defer C.free(unsafe.Pointer(loc))
	msg, cmsg := errbuf()
	var t *C.leasehold_tokens
	if rc := C.leasehold_tokens_open(loc, &t, cmsg, C.size_t(len(msg))); rc != C.LEASEHOLD_OK {
		return nil, fail(rc, msg, "leasehold_tokens_open")
	}
	return &Tokens{t: t}, nil
}

// Close unmaps the channel.
func (t *Tokens) Close() error {
	if t.t != nil {
		C.leasehold_tokens_close(t.t)
		t.t = nil
	}
	return nil
}

// Token is the signed token of this sandbox's grant at epoch (TokenBytes bytes): ErrNotFound
// when there is none for that epoch, ErrBusy, ErrArg.
func (t *Tokens) Token(epoch uint64) ([]byte, error) {
	if t.t == nil {
		return nil, &Error{Code: ErrArg, Message: "the token channel is closed"}
	}
	buf := make([]byte, TokenBytes)
	rc := C.leasehold_token(t.t, C.uint64_t(epoch), (*C.uint8_t)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)))
	if rc < 0 {
		return nil, fail(rc, nil, fmt.Sprintf("leasehold_token(epoch %d)", epoch))
	}
	return buf[:rc], nil
}

// Verifier is a resource's token verifier: lockd's public key(s) alone.
type Verifier struct {
	v *C.leasehold_verifier
}

// NewVerifier is a verifier without keys.
func NewVerifier() (*Verifier, error) {
	v := C.leasehold_verifier_new()
	if v == nil {
		return nil, &Error{Code: ErrIO, Message: "leasehold_verifier_new: out of memory"}
	}
	return &Verifier{v: v}, nil
}

// Close frees the verifier.
func (v *Verifier) Close() error {
	if v.v != nil {
		C.leasehold_verifier_free(v.v)
		v.v = nil
	}
	return nil
}

func (v *Verifier) closed() error { return &Error{Code: ErrArg, Message: "the verifier is closed"} }

// AddKeyFile adds a public key file (PEM as lockd writes STORE.signing.key.pub, 32 raw bytes,
// or 64 hex digits): ErrArg or ErrIO.
func (v *Verifier) AddKeyFile(path string) error {
	if v.v == nil {
		return v.closed()
	}
	p, err := cstring(path, "path")
	if err != nil {
		return err
	}
	defer C.free(unsafe.Pointer(p))
	msg, cmsg := errbuf()
	if rc := C.leasehold_verifier_add_key_file(v.v, p, cmsg, C.size_t(len(msg))); rc != C.LEASEHOLD_OK {
		return fail(rc, msg, "leasehold_verifier_add_key_file("+path+")")
	}
	return nil
}

// AddKey adds a raw 32-byte Ed25519 public key: ErrArg otherwise.
func (v *Verifier) AddKey(publicKey []byte) error {
	if v.v == nil {
		return v.closed()
	}
	if len(publicKey) == 0 {
		return &Error{Code: ErrArg, Message: "leasehold_verifier_add_key: empty key"}
	}
	rc := C.leasehold_verifier_add_key(v.v, (*C.uint8_t)(unsafe.Pointer(&publicKey[0])), C.size_t(len(publicKey)))
	if rc != C.LEASEHOLD_OK {
		return fail(rc, nil, fmt.Sprintf("leasehold_verifier_add_key(%d bytes)", len(publicKey)))
	}
	return nil
}

// Verify returns nil when lockd signed exactly the grant (name, epoch, holder); else an *Error
// whose ErrToken* code names why (ErrArg: a malformed name or holder).
func (v *Verifier) Verify(token []byte, name string, epoch uint64, holder string) error {
	if v.v == nil {
		return v.closed()
	}
	n, err := cstring(name, "name")
	if err != nil {
		return err
	}
	defer C.free(unsafe.Pointer(n))
	h, err := cstring(holder, "holder")
	if err != nil {
		return err
	}
	defer C.free(unsafe.Pointer(h))
	if n == nil || h == nil {
		return &Error{Code: ErrArg, Message: "leasehold_verify: empty name or holder"}
	}
	var tok *C.uint8_t
	if len(token) > 0 {
		tok = (*C.uint8_t)(unsafe.Pointer(&token[0]))
	}
	msg, cmsg := errbuf()
	rc := C.leasehold_verify(v.v, tok, C.size_t(len(token)), n, C.uint64_t(epoch), h, cmsg, C.size_t(len(msg)))
	if rc != C.LEASEHOLD_OK {
		return fail(rc, msg, "leasehold_verify")
	}
	return nil
}
