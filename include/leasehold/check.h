/* leasehold/check.h: the C ABI of the shared-memory epoch table (libleasehold-check).
 *
 * A sandbox runtime maps the supervisor's epoch table read-only and checks, before every side
 * effect, that its lease is still valid (DESIGN.md "The shared-memory epoch table"). The
 * supervisor puts the table location, the slot index and the epoch in the sandbox's env:
 * LEASEHOLD_SHM, LEASEHOLD_SLOT, LEASEHOLD_EPOCH. LEASEHOLD_SHM is a descriptor number (an
 * isolated sandbox inherits the table as a read-only descriptor, "3"), an absolute path or a shm
 * name; a table opened by path must be owned by root or the caller's uid and writable by neither
 * group nor others (else LEASEHOLD_E_IO, the message says why).
 *
 *   leasehold_table *t;  char err[256];
 *   if (leasehold_open(NULL, 1000, &t, err, sizeof err) != 0) { fprintf(stderr, "%s\n", err); ... }
 *   leasehold_lease l = leasehold_lease_at(t, slot, epoch);         // once
 *   if (!leasehold_lease_valid(l)) abort_side_effect();             // hot: 1 load + compare
 *   if (!leasehold_check_deadline(t, slot, epoch)) abort_side_effect();  // + 1 vDSO clock read
 *
 * Functions return 0 / a positive answer on success and a negative LEASEHOLD_E* code on error
 * (liburing style). Everything is thread-safe; nothing blocks the writer; the check functions
 * do not allocate and make no syscall (check_deadline reads CLOCK_BOOTTIME through the vDSO).
 *
 * leasehold_check() has no clock: it cannot see a dead writer or an expired deadline. Call
 * leasehold_check_deadline() before side effects that must be fenced, or at least
 * periodically; it fails when the writer's heartbeat is stale or the table is closed.
 */
#ifndef LEASEHOLD_CHECK_H
#define LEASEHOLD_CHECK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The library's version, MAJOR.MINOR.PATCH: the major is the ABI (the soname,
 * libleasehold-check.so.1), the minor counts functions added within it (1.1:
 * leasehold_check_version), the patch fixes. The build reads these lines for the library's file
 * version, soname and pkg-config version; leasehold_check_version() gives the same at run time. */
#define LEASEHOLD_CHECK_ABI_VERSION 1
#define LEASEHOLD_CHECK_VERSION_MINOR 1
#define LEASEHOLD_CHECK_VERSION_PATCH 0
#define LEASEHOLD_LAYOUT_MAJOR 3        /* table layout this header understands */

/* Error codes (negative return values). */
#define LEASEHOLD_OK 0
#define LEASEHOLD_E_MISSING (-1)      /* no table at the location (or LEASEHOLD_SHM unset) */
#define LEASEHOLD_E_TRUNCATED (-2)    /* file smaller than its header says */
#define LEASEHOLD_E_BAD_MAGIC (-3)    /* not a leasehold table */
#define LEASEHOLD_E_VERSION (-4)      /* incompatible layout major version */
#define LEASEHOLD_E_GEOMETRY (-5)     /* inconsistent header */
#define LEASEHOLD_E_NOT_READY (-6)    /* the writer has not finished creating it */
#define LEASEHOLD_E_BAD_SLOT (-7)     /* slot index out of range */
#define LEASEHOLD_E_NOT_FOUND (-8)    /* no slot for that sandbox */
#define LEASEHOLD_E_IO (-9)           /* the OS refused (permission, ...) */
#define LEASEHOLD_E_ARG (-10)         /* malformed argument */
#define LEASEHOLD_E_BUSY (-11)        /* slot kept changing; retry */
/* Token verification (leasehold_verify): why a token does not authorize the write. */
#define LEASEHOLD_E_TOKEN_UNSIGNED (-12)      /* no token at all */
#define LEASEHOLD_E_TOKEN_MALFORMED (-13)     /* wrong length, magic, version or reserved bytes */
#define LEASEHOLD_E_TOKEN_UNKNOWN_KEY (-14)   /* signed with a key id this verifier does not hold */
#define LEASEHOLD_E_TOKEN_BAD_SIGNATURE (-15) /* forged, altered, or signed by another key */
#define LEASEHOLD_E_TOKEN_WRONG_NAME (-16)    /* a valid token of another name */
#define LEASEHOLD_E_TOKEN_WRONG_EPOCH (-17)   /* a valid token of another epoch */
#define LEASEHOLD_E_TOKEN_WRONG_HOLDER (-18)  /* a valid token of another holder */

/* Bytes of a signed fencing token (lockd's Ed25519-signed {name, epoch, holder, worker,
 * issued_at, key_id}; the encoding is in the project's docs/PROTOCOL.md "Fencing tokens"). */
#define LEASEHOLD_TOKEN_BYTES 140

typedef struct leasehold_table leasehold_table; /* a read-only mapping */
typedef struct leasehold_slot leasehold_slot;   /* one 64-byte slot; opaque except below */

/* Layout guarantee (1.x to 3.x): a slot's first 8 bytes are its check word, a uint64_t holding the
 * epoch while the lease is valid (the revoked bit 2^63 set, or 0, otherwise). */
#define LEASEHOLD_REVOKED_BIT (UINT64_C(1) << 63)

/* leasehold_slot_info.state: a slot's lifecycle (stable values). */
#define LEASEHOLD_SLOT_FREE 0       /* never used, or cooled down */
#define LEASEHOLD_SLOT_CLAIMED 1    /* owned by a sandbox, no epoch published yet */
#define LEASEHOLD_SLOT_PUBLISHED 2  /* name, epoch and deadline published */
#define LEASEHOLD_SLOT_COOLING 3    /* freed; not reused until its cooldown has passed */
#define LEASEHOLD_SLOT_UNKNOWN UINT32_MAX /* a state byte this library does not know (a newer or
                                           * damaged table): rely on nothing in the slot */

/* A consistent copy of one slot. */
typedef struct leasehold_slot_info {
  uint32_t index;
  uint32_t generation;        /* +1 each time the slot is claimed */
  uint32_t state;             /* LEASEHOLD_SLOT_* */
  uint32_t revoked;           /* 1 if revoked */
  uint64_t epoch;             /* 0: none published */
  uint8_t sandbox_id[16];     /* UUID bytes, big-endian */
  uint8_t name_id[16];
  uint64_t valid_until_ns;    /* CLOCK_BOOTTIME */
  uint32_t name_bytes;        /* full length of the name */
  char name_prefix[8];        /* first bytes of the name, NUL-terminated */
} leasehold_slot_info;

/* The version of the library loaded at run time, "MAJOR.MINOR.PATCH" (a static string, never
 * NULL). A runtime built against this header needs MAJOR == LEASEHOLD_CHECK_ABI_VERSION (the
 * dynamic loader already enforces it through the soname) and MINOR >= the minor of the newest
 * function it calls. Since 1.1. */
const char* leasehold_check_version(void);

/* Opens the table at `location` (a shm name such as "leasehold-w1", or an absolute path with
 * a directory, such as "/dev/shm/leasehold-w1"); NULL means $LEASEHOLD_SHM. Waits up to
 * wait_ms for the file to appear and become ready. On error returns a LEASEHOLD_E* code and
 * writes a message naming the problem into err (if err_len > 0). */
int leasehold_open(const char* location, uint32_t wait_ms, leasehold_table** out, char* err,
                   size_t err_len);
void leasehold_close(leasehold_table* table);

/* The slot at `index`, or NULL when out of range. Resolve once, check many times. */
const leasehold_slot* leasehold_slot_at(const leasehold_table* table, uint32_t index);
uint32_t leasehold_slot_count(const leasehold_table* table);

/* The hot check: 1 if the slot holds `epoch` (published, not revoked), else 0.
 * One acquire load and a compare; inline, no call, no syscall. */
static inline int leasehold_check(const leasehold_slot* slot, uint64_t epoch) {
  uint64_t word;
  if (slot == NULL) return 0;
  word = __atomic_load_n((const uint64_t*)(const void*)slot, __ATOMIC_ACQUIRE);
  /* Branch-free range test (epochs live in [1, 2^63)): a caller's loop hoists it. */
  return (word == epoch) & ((int64_t)epoch > 0);
}

/* A resolved (slot, epoch): leasehold_lease_at validates the slot index and the epoch once,
 * so leasehold_lease_valid is exactly one acquire load and one compare. A bad index or epoch
 * resolves to a word that never matches, so leasehold_lease_valid then always returns 0. */
typedef struct leasehold_lease {
  const uint64_t* word;
  uint64_t epoch;
} leasehold_lease;
leasehold_lease leasehold_lease_at(const leasehold_table* table, uint32_t index, uint64_t epoch);
static inline int leasehold_lease_valid(leasehold_lease lease) {
  return __atomic_load_n(lease.word, __ATOMIC_ACQUIRE) == lease.epoch;
}

/* The same as an exported function (for FFI: Python ctypes, Go, ...). */
int leasehold_check_slot(const leasehold_table* table, uint32_t index, uint64_t epoch);

/* leasehold_check, and: valid_until not passed, writer heartbeat fresh, table not closed.
 * 1 valid, 0 not valid. One CLOCK_BOOTTIME read through the vDSO. */
int leasehold_check_deadline(const leasehold_table* table, uint32_t index, uint64_t epoch);

/* Writer liveness: 1 alive, 0 dead or closed. age_ns (may be NULL) gets the heartbeat age,
 * UINT64_MAX when there is none. */
int leasehold_writer_alive(const leasehold_table* table, uint64_t* age_ns);

/* Consistent copy of slot `index` (seqlock, bounded retries): 0 or LEASEHOLD_E_BAD_SLOT /
 * LEASEHOLD_E_BUSY. */
int leasehold_snapshot(const leasehold_table* table, uint32_t index, leasehold_slot_info* out);

/* The slot of a sandbox (UUID text, any case, dashes optional): its index (>= 0), or
 * LEASEHOLD_E_ARG / LEASEHOLD_E_NOT_FOUND. */
int64_t leasehold_find_sandbox(const leasehold_table* table, const char* sandbox_uuid);

/* The sandbox's own token channel: a read-only mapping of the small sealed memfd the supervisor
 * writes the signed tokens of this sandbox's grants into (no other sandbox's). `location` is the
 * inherited descriptor's number as text ("4"); NULL means $LEASEHOLD_TOKENS, which the supervisor
 * sets in every sandbox it starts. On error returns LEASEHOLD_E_MISSING (NULL and the variable
 * unset, or no such descriptor), LEASEHOLD_E_ARG (not a descriptor number), LEASEHOLD_E_BAD_MAGIC
 * (not a token channel), LEASEHOLD_E_VERSION, LEASEHOLD_E_GEOMETRY, LEASEHOLD_E_TRUNCATED,
 * LEASEHOLD_E_IO, with a message in err. */
typedef struct leasehold_tokens leasehold_tokens;
int leasehold_tokens_open(const char* location, leasehold_tokens** out, char* err, size_t err_len);
void leasehold_tokens_close(leasehold_tokens* tokens);

/* The signed token of this sandbox's grant at `epoch` (what it sends a resource with its writes):
 * copies it into buf (buf_len >= LEASEHOLD_TOKEN_BYTES) and returns its length, or
 * LEASEHOLD_E_NOT_FOUND (no token for that epoch: another grant, none yet, or lockd signs none),
 * LEASEHOLD_E_BUSY, LEASEHOLD_E_ARG. */
int leasehold_token(const leasehold_tokens* tokens, uint64_t epoch, uint8_t* buf, size_t buf_len);

/* A resource's token verifier: lockd's public key(s) alone (no key that grants power over any
 * name). Holds several keys by key id (rotation); remembers each token it accepted, so a holder's
 * later writes of the same grant cost a compare, not a signature check. Thread-safe. */
typedef struct leasehold_verifier leasehold_verifier;
leasehold_verifier* leasehold_verifier_new(void); /* NULL when out of memory */
void leasehold_verifier_free(leasehold_verifier* verifier);
/* Adds a public key file (PEM, as leasehold-lockd writes STORE.signing.key.pub; 32 raw bytes; or
 * 64 hex digits): 0, or LEASEHOLD_E_ARG / LEASEHOLD_E_IO with a message in err. */
int leasehold_verifier_add_key_file(leasehold_verifier* verifier, const char* path, char* err, size_t err_len);
/* Adds a raw 32-byte Ed25519 public key: 0 or LEASEHOLD_E_ARG. */
int leasehold_verifier_add_key(leasehold_verifier* verifier, const uint8_t* public_key, size_t len);
/* Verifies `token` as the token of a write to (name, epoch, holder): 0 when lockd signed exactly
 * that grant, else a LEASEHOLD_E_TOKEN_* code (LEASEHOLD_E_ARG for a malformed name or holder)
 * with a message naming the reason in err. name: the name text; holder_uuid: the sandbox id
 * as UUID text. A resource admits an epoch above the highest it has seen only when this is 0. */
int leasehold_verify(leasehold_verifier* verifier, const uint8_t* token, size_t token_len, const char* name,
                     uint64_t epoch, const char* holder_uuid, char* err, size_t err_len);

/* Stable text of a LEASEHOLD_E* code. */
const char* leasehold_strerror(int code);

#ifdef __cplusplus
}
#endif

#endif /* LEASEHOLD_CHECK_H */
