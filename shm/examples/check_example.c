/* check_example: how a sandbox runtime checks its lease before a side effect.
 *
 * The supervisor starts every sandbox with LEASEHOLD_SHM (table location), LEASEHOLD_SLOT
 * (slot index) and LEASEHOLD_EPOCH (the epoch of its name). Build:
 *   cc check_example.c $(pkg-config --cflags --libs leasehold-check)
 * Exit status: 0 the lease is valid, 1 it is not, 2 setup error.
 */
#include <leasehold/check.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

static int env_u64(const char* name, uint64_t* out) {
  const char* v = getenv(name);
  char* end = NULL;
  if (v == NULL || *v == '\0') {
    fprintf(stderr, "check_example: %s is not set\n", name);
    return -1;
  }
  *out = strtoull(v, &end, 10);
  if (*end != '\0') {
    fprintf(stderr, "check_example: %s='%s' is not a decimal number\n", name, v);
    return -1;
  }
  return 0;
}

int main(void) {
  uint64_t slot = 0, epoch = 0, age_ns = 0;
  char err[512];
  leasehold_table* table = NULL;

  if (env_u64("LEASEHOLD_SLOT", &slot) != 0 || env_u64("LEASEHOLD_EPOCH", &epoch) != 0) return 2;
  /* NULL location: use $LEASEHOLD_SHM; wait up to 1 s for the supervisor to create it. */
  int rc = leasehold_open(NULL, 1000, &table, err, sizeof err);
  if (rc != 0) {
    fprintf(stderr, "check_example: %s (%s)\n", err, leasehold_strerror(rc));
    return 2;
  }
  if (slot >= leasehold_slot_count(table)) {
    fprintf(stderr, "check_example: slot %" PRIu64 " is out of range\n", slot);
    leasehold_close(table);
    return 2;
  }
  /* Resolve once at start-up ... */
  const leasehold_lease lease = leasehold_lease_at(table, (uint32_t)slot, epoch);

  /* ... then the hot path, before every side effect: one acquire load and a compare. It has
   * no clock, so it cannot see a dead writer or an expired deadline. */
  int valid = leasehold_lease_valid(lease);
  /* Before a side effect that must be fenced: adds the deadline and writer liveness. */
  int valid_deadline = leasehold_check_deadline(table, (uint32_t)slot, epoch);
  int alive = leasehold_writer_alive(table, &age_ns);

  printf("slot=%" PRIu64 " epoch=%" PRIu64 " check=%d check_deadline=%d writer_alive=%d\n", slot,
         epoch, valid, valid_deadline, alive);
  leasehold_close(table);
  return valid && valid_deadline ? 0 : 1;
}
