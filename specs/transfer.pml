/*
 * leasehold, model 3: ownership transfer and fencing (DESIGN.md "Lock states": BeginTransfer,
 * CompleteRelease, Acquire by the intended owner, Revoke, Reassign; "Vocabulary": token,
 * fencing).
 *
 * One name, two nodes.  The name's record is Owned{owner, epoch},
 * Transferring{from, to, old_epoch, new_epoch} or Unowned{epoch, intended_owner}
 * (DESIGN.md calls them Held and Free{reserved_for}).  current_epoch is new_epoch while
 * Transferring.  Every grant issues a token {node, epoch}; issued tokens are never
 * withdrawn (a per-node bit set that only grows), so a node that was partitioned or
 * paused can always come back and present any token it ever received.  Whether a token
 * authorizes anything is decided by the current record (token_authorized = may_mutate).
 *
 * Processes:
 *   Lockd     any enabled transition, in any order: acquire, release, begin_transfer,
 *             complete_release, revoke (no cooperation from the owner), reassign.
 *   Workers   the supervisors: a node's sandbox runs from its grant until it releases, or
 *             until its supervisor kills it once the grant is no longer its own (lockd's
 *             Revoked push at revoke / begin_transfer, or a `lost` heartbeat answer); the kill
 *             is then confirmed to lockd (KillConfirmed, or the supervisor's Release of that
 *             grant), or lockd's bound for it passes (the old lease + lock-delay; reliable
 *             timing: the kill-switch fired before it).  Both lift the guard.
 *   Node(n)   presents any token it holds to the resource, at any time.  The resource's
 *             FenceGate admits the write iff valid_fence: the token's epoch is at least the
 *             highest epoch the gate has seen.  The gate sees the epochs of the writes it
 *             admits and, in the same step as any transition that moves the current epoch,
 *             that new epoch (ANNOUNCE below).
 *
 * Safety only: nothing here claims a transfer completes (no fairness, no liveness).
 * Epochs are bounded by EPOCH_MAX (a transition that would pass it is disabled); each
 * bound is a state-space limit, not a protocol limit.
 *
 * Revoke is `leasehold revoke --fence-db`: the new epoch is announced to the resource's gate
 * first, then lockd revokes (only if the epoch is still the one announced for).  A transfer
 * reservation (Unowned with an intended owner) has a TTL: it lapses to plain Free at the
 * same epoch.
 *
 * The guard (LeaseTable's pending revoke / transfer guard): begin_transfer and revoke leave
 * the outgoing grant's node in `guard`; until it is lifted, complete_release is refused
 * (lock_delay) and so is every acquire, the reserved node's included.
 *
 * Ablations:
 *   -DCOMPLETE_UNGUARDED        begin_transfer leaves no guard and complete_release does not
 *                               wait for one (the old code: the CLI, not lockd, decided the
 *                               old holder was gone)
 *   -DANNOUNCE_AFTER_REVOKE     the old order: revoke, then announce lockd's answer
 *   -DNO_RESERVATION_CHECK      acquire ignores the reservation
 *   -DOLD_OWNER_KEEPS_EPOCH     begin_transfer leaves the epoch as it is; the new epoch is
 *                               allocated only when the release completes
 *   -DGATE_LEARNS_ONLY_FROM_WRITES   the FenceGate is never told that the epoch moved; it
 *                               knows only the epochs of writes it admitted
 */

#define NODES 2
#define NOBODY 255
#ifndef EPOCH_MAX
#define EPOCH_MAX 5
#endif

#define OWNED        0
#define TRANSFERRING 1
#define UNOWNED      2

byte kind = UNOWNED;
byte owner = NOBODY;        /* Owned: owner; Transferring: from */
byte to = NOBODY;           /* Transferring: to; Unowned: intended owner (NOBODY = anyone) */
byte cur = 0;               /* current_epoch */
byte old = 0;               /* Transferring: old_epoch */
byte issued[NODES];         /* bit e set: token {n, e} was issued; bits are never cleared */
byte seen = 0;              /* FenceGate: highest epoch seen */

/* ghosts for the properties */
byte stale_upto = 0;        /* tokens with epoch <= stale_upto are stale: their grant was
                               handed over, revoked, re-offered or superseded.  Defined by
                               the protocol's intent, not by the epoch arithmetic, so an
                               ablation that gets the arithmetic wrong is caught. */
bool admitted_stale;        /* a write was admitted with a stale token */
bool admitted_in_transfer;  /* a write was admitted while the name was Transferring */
byte g_max_admitted = 0;    /* the highest epoch the gate admitted a write at */
bool g_admitted;            /* some write was admitted */
byte g_xfer_to = NOBODY;    /* a transfer to this node began and has not ended */
bool g_xfer_misdirected;    /* a transfer ended with someone else acquiring */
bool g_xfer_done;           /* a transfer ended with its intended owner acquiring */
bool g_reservation_broken;  /* a reserved name was acquired by another node */
bool fresh;                 /* Unowned: cur was allocated (transfer, revoke, reassign) and not
                               granted yet; the next grant takes it (LeaseTable epoch_fresh) */
byte g_intended = NOBODY;   /* the owner a reservation was made for (transfer, reassign) */
byte g_lapsed_for = NOBODY; /* a reservation for this node lapsed, nobody acquired since */
bool g_taken_after_lapse;   /* another node acquired the name after the reservation lapsed */
bool rv_announced;          /* revoke --fence-db: the gate was told cur + 1, revoke not applied */
byte rv_epoch;              /* the epoch the revoke was announced for (observed cur + 1) */
bool running[NODES];        /* node n's sandbox runs (from its grant until killed or released) */
byte guard = NOBODY;        /* the node whose outgoing grant's kill lockd waits for (NOBODY: none) */
bool g_ran;                 /* some sandbox ran */
bool g_xfer_kill;           /* a supervisor killed the outgoing holder of a transfer */

#define HAS(n, e)        ((issued[n] >> (e)) & 1)
#define MAY(n)           (kind == OWNED && owner == (n) && HAS(n, cur))
/* n holds a token the FenceGate would admit now: one at or above the highest it has seen */
#define PASSES(n)        ((issued[n] >> seen) != 0)

/* Whenever the current epoch moves, it is admitted at the gate as part of the same step
 * (FenceGate::admit(name, new_epoch) by whoever moved it, or a reply gate that re-reads
 * the record), so the gate never lags the record. */
#ifdef GATE_LEARNS_ONLY_FROM_WRITES
#define ANNOUNCE         skip
#else
#define ANNOUNCE         if :: cur > seen -> seen = cur :: else fi
#endif

proctype Lockd()
{
	byte n;
end_idle:
	do
	:: atomic {    /* acquire (LeaseTable::acquire): Free -> Held; +1 unless reserved */
		kind == UNOWNED && (to != NOBODY || fresh || cur < EPOCH_MAX) ->
		if
		:: /*@G acquire_unguarded*/ guard == NOBODY -> skip
		:: else -> goto refused                 /* Refusal::lock_delay */
		fi;
		select(n : 0 .. NODES-1);
		if
		:: /*@G acquire_reserved*/ to == n -> skip      /* reserved for n: epoch already new */
		:: /*@G acquire_fresh*/ to == NOBODY && fresh -> skip   /* revoked / lapsed: granted at it */
		:: /*@G acquire_unreserved*/ to == NOBODY && !fresh && cur < EPOCH_MAX -> /*@E acquire_epoch*/ cur++
#ifdef NO_RESERVATION_CHECK
		:: else -> cur++
#else
		:: else -> goto refused                 /* Refusal::reserved */
#endif
		fi;
		g_reservation_broken = g_reservation_broken || (g_intended != NOBODY && g_intended != n);
		g_taken_after_lapse = g_taken_after_lapse || (g_lapsed_for != NOBODY && g_lapsed_for != n);
		g_intended = NOBODY; g_lapsed_for = NOBODY;
		g_xfer_misdirected = g_xfer_misdirected || (g_xfer_to != NOBODY && g_xfer_to != n);
		g_xfer_done = g_xfer_done || g_xfer_to == n;
		g_xfer_to = NOBODY;
		/*@E acquire_owned*/ kind = OWNED; owner = n; /*@E acquire_clears_reservation*/ to = NOBODY; /*@E acquire_not_fresh*/ fresh = false;
		/*@E issue*/ issued[n] = issued[n] | (1 << cur);
		/*@E acquire_runs*/ running[n] = true; g_ran = true;
		stale_upto = cur - 1;                   /* every earlier grant is superseded */
		ANNOUNCE;
refused:	n = 0
	   }
	:: atomic {    /* release by the holder (LeaseTable::release): Held -> Free, epoch =;
		        * the supervisor releases only after the sandbox exited */
		kind == OWNED -> /*@E release_stops*/ running[owner] = false;
		/*@E release*/ kind = UNOWNED; owner = NOBODY; to = NOBODY; fresh = false
	   }
	:: atomic {    /* begin_transfer(from -> to): +1 here, so the old owner is fenced at once */
		/*@G begin_held*/ kind == OWNED && cur < EPOCH_MAX ->
		/*@E begin_transferring*/ kind = TRANSFERRING; /*@E begin_to*/ to = 1 - owner; old = cur;
#ifndef COMPLETE_UNGUARDED
		/*@E begin_guard*/ guard = owner;       /* Revoked pushed to owner's worker */
#endif
		stale_upto = old;                       /* the owner agreed to hand over */
		g_xfer_to = to;
#ifndef OLD_OWNER_KEEPS_EPOCH
		/*@E begin_epoch*/ cur++;
#endif
		ANNOUNCE
	   }
	:: atomic {    /* complete_release: Transferring -> Free{reserved_for = to} */
		/*@G complete_transferring*/ kind == TRANSFERRING ->
		if
#ifndef COMPLETE_UNGUARDED
		:: /*@G complete_guarded*/ guard == NOBODY ->
#else
		:: true ->
#endif
#ifdef OLD_OWNER_KEEPS_EPOCH
			cur++;
			ANNOUNCE;
#endif
			/*@E complete_free*/ kind = UNOWNED; owner = NOBODY; old = 0; /*@E complete_fresh*/ fresh = true;
			/*@E complete_unguard*/ guard = NOBODY;   /* the Free record carries no pending revoke */
			g_intended = to
		:: else                                 /* Refusal::lock_delay: nothing moved */
		fi
	   }
	:: atomic {    /* the guard lifts: the outgoing holder's worker confirmed its kill
		        * (KillConfirmed, or its Release of that grant), or the bound passed */
		/*@G lift_dead*/ guard != NOBODY && !running[guard] -> /*@E lift*/ guard = NOBODY
	   }
	:: atomic {    /* the transfer reservation's TTL lapses: plain Free at the same epoch */
		/*@G reservation_lapse*/ kind == UNOWNED && to != NOBODY ->
		/*@E lapse_clears*/ to = NOBODY;
		if   /* a reservation in Free lapsed (the ghosts follow the intent, not `to`) */
		:: kind == UNOWNED && g_intended != NOBODY ->
			g_xfer_to = NOBODY; g_lapsed_for = g_intended; g_intended = NOBODY
		:: else
		fi
	   }
#ifndef ANNOUNCE_AFTER_REVOKE
	/* revoke --fence-db: read the record, announce epoch + 1 to the resource's gate, then
	 * revoke (refused if the epoch moved meanwhile; the operator starts again) */
	:: atomic {
		!rv_announced && kind != UNOWNED && cur < EPOCH_MAX ->
		rv_announced = true; rv_epoch = cur + 1;
		if :: rv_epoch > seen -> /*@E revoke_announce*/ seen = rv_epoch :: else fi
	   }
	:: atomic {    /* revoke (coordinator, no cooperation): -> Free, +1 */
		rv_announced ->
		rv_announced = false;
		if
		:: /*@G revoke_same_epoch*/ kind != UNOWNED && cur + 1 == rv_epoch ->
			stale_upto = cur;
			if   /* Owned: the holder may run; Transferring: the transfer's guard carries over */
			:: kind == OWNED -> /*@E revoke_guard*/ guard = owner
			:: else
			fi;
			/*@E revoke_free*/ kind = UNOWNED; owner = NOBODY; to = NOBODY; old = 0;
			g_xfer_to = NOBODY; g_intended = NOBODY; g_lapsed_for = NOBODY;  /* ended by a revoke */
			/*@E revoke_epoch*/ cur++; /*@E revoke_fresh*/ fresh = true
		:: else                                 /* Refusal::stale_epoch: nothing moved */
		fi;
		rv_epoch = 0
	   }
#else
	/* the old order: revoke, then announce the epoch lockd answered */
	:: atomic {
		!rv_announced && kind != UNOWNED && cur < EPOCH_MAX ->
		stale_upto = cur;
		if :: kind == OWNED -> guard = owner :: else fi;
		kind = UNOWNED; owner = NOBODY; to = NOBODY; old = 0; cur++; fresh = true;
		g_xfer_to = NOBODY; g_intended = NOBODY; g_lapsed_for = NOBODY;
		rv_announced = true; rv_epoch = cur
	   }
	:: atomic {
		rv_announced -> rv_announced = false;
		if :: rv_epoch > seen -> seen = rv_epoch :: else fi;
		rv_epoch = 0
	   }
#endif
	:: atomic {    /* reassign: Free -> Free reserved for n, +1 */
		/*@G reassign_free*/ kind == UNOWNED && cur < EPOCH_MAX ->
		select(n : 0 .. NODES-1);
		stale_upto = cur;
		g_xfer_to = NOBODY;                     /* a pending transfer is superseded */
		g_intended = n; g_lapsed_for = NOBODY;
		/*@E reassign_to*/ to = n; /*@E reassign_epoch*/ cur++; fresh = true; n = 0;
		ANNOUNCE
	   }
	od
}

/* A node presents a token it holds, perhaps long after it stopped being the owner. */
proctype Node(byte me)
{
	byte e;
end_idle:
	do
	:: atomic {
		select(e : 1 .. EPOCH_MAX);
		if
		:: HAS(me, e) ->
			/* FenceGate::admit: valid_fence(e) := e >= highest seen; admitting raises it */
			if
			:: /*@G gate_admits*/ e >= seen ->
				/*@E gate_records*/ seen = e;
				g_admitted = true;
				if :: e > g_max_admitted -> g_max_admitted = e :: else fi;
				admitted_stale = admitted_stale || e <= stale_upto;
				admitted_in_transfer = admitted_in_transfer || kind == TRANSFERRING
			:: else                                  /* rejected: stale token */
			fi
		:: else
		fi;
		e = 0
	   }
	od
}

/* A supervisor kills its sandbox once the grant is no longer its own (pushed, or answered
 * `lost`); it may take any time to do so. */
proctype Workers()
{
	byte n;
end_idle:
	do
	:: atomic {
		select(n : 0 .. NODES-1);
		if
		:: /*@G kill_not_owner*/ running[n] && !(kind == OWNED && owner == n) ->
			g_xfer_kill = g_xfer_kill || (running[n] && kind == TRANSFERRING && owner == n);
			/*@E kill*/ running[n] = false
		:: else
		fi;
		n = 0
	   }
	od
}

init {
	atomic { run Lockd(); run Node(0); run Node(1); run Workers() }
}

/* may_mutate holds only for an issued token (theorem_no_authority_without_token). */
ltl NoAuthorityWithoutToken { [] (kind == OWNED -> HAS(owner, cur)) }

/* Never two nodes that may mutate: neither by the record (may_mutate) nor at the resource
 * (two nodes each holding a token the FenceGate would admit). */
ltl SingleMutator { [] (!(MAY(0) && MAY(1)) && !(PASSES(0) && PASSES(1))) }

/* A stale token (its grant handed over by begin_transfer, revoked, re-offered by
 * reassign or superseded by a later grant) is rejected by the resource. */
ltl StaleTokenRejected { [] !admitted_stale }

/* Nobody may mutate during a transfer: no node may_mutate, and the resource admits
 * nothing. */
ltl NoMutationDuringTransfer {
	[] ((kind == TRANSFERRING -> (!MAY(0) && !MAY(1))) && !admitted_in_transfer)
}

/* ReservationHonoured: a name reserved for a node (transfer, reassign) is acquired by no
 * other node until the reservation ends (its TTL lapses, or a revoke). */
ltl ReservationHonoured { [] !g_reservation_broken }

/* TransferEndsWithIntendedOwner: a transfer ends with its intended owner acquiring the
 * name, or with a revoke, reassign or the reservation's lapse; never with another node's
 * grant. */
ltl TransferEndsWithIntendedOwner { [] !g_xfer_misdirected }

/* GateRecordsAdmitted: the gate's highest seen epoch is at least every epoch it admitted. */
ltl GateRecordsAdmitted { [] (seen >= g_max_admitted) }

/* OneRunning: never two sandboxes running on the name at once: a transfer's receiver (or
 * anyone after a revoke) starts only after the outgoing holder is dead. */
ltl OneRunning { [] !(running[0] && running[1]) }

/* Non-vacuity (expected to FAIL): a write is admitted, a transfer completes, and a name
 * whose reservation lapsed is acquired by another node; a sandbox runs; the outgoing holder
 * of a transfer is killed by its supervisor. */
ltl NeverRan { [] !g_ran }
ltl NeverKilledForTransfer { [] !g_xfer_kill }
ltl NeverAdmitted { [] !g_admitted }
ltl NeverTransferred { [] !g_xfer_done }
ltl NeverTakenAfterLapse { [] !g_taken_after_lapse }
