/*
 * leasehold, model 4: replicated lockd on etcd — leader election through an etcd lease, a
 * deposed leader that keeps running, and the takeover's restart rule (lockd/service.hpp "The
 * restart rule"; lockd/durability.hpp: a rejected write stops the service).
 *
 * Two lockd processes share one etcd; one name; two holders (a supervisor and its sandbox
 * each).  Processes:
 *   Lockd(i)    campaign (etcd lease + "create the election key if it does not exist"), and on
 *               winning the takeover: read the durable rows, restore the Held lease by the
 *               restart rule; keep-alives of the leadership lease; a partition from etcd ("cut":
 *               from then on no write of i lands and no keep-alive arrives, but i keeps
 *               running, answering from memory); a cut lockd's crash and restart as a
 *               follower with an empty table (a lockd whose write was rejected exits and
 *               restarts the same way, in the step of the rejection).
 *   Holder(h)   acquire (at either lockd), heartbeats (at either lockd: the supervisor sends
 *               to whichever it believes leads, and counts an answer of any lockd), exit and
 *               release.  Every step is optional: a holder that stops heartbeating is a holder
 *               whose supervisor crashed or was cut off (its sandbox then dies by the
 *               kill-switch at the latest).
 *   Clock       one tick of time: the supervisors' kill-switches, lockd's lease expiry and
 *               lived checkpoints, etcd's lease expiry (which deletes the election key).
 *
 * Time is counted here (unlike models 1-3), in whole ticks, by countdowns that the Clock moves
 * together: lockd's lease TTL (TTL), the supervisor's kill_after (KA), the leadership lease L
 * (LL), the lived-checkpoint interval (CKPT).  A deadline D ticks after an event fires in the
 * D-th tick after it, and requests are served between ticks, so a name freed in a tick is
 * granted only after it.  KA = TTL is therefore the safety inequality kill_after + margins <
 * TTL: the kill-switch fires in the tick in which lockd would expire an ordinary refresh of the
 * same send, and the sandbox is dead before the name can go to anyone else.  The model has one
 * tick of slack and no more: a refresh answered by a deposed leader precedes the tick that
 * deletes its election key, and the next leader wins after it (a takeover that restored every
 * lease one tick short would go unnoticed, two ticks short breaks MutualExclusion).
 * A request and its answer are one step (send = receipt = answer): the worst case for every
 * deadline here, since the supervisor counts from the send and lockd and etcd from the
 * receipt.  The same for keep-alives: the lockd counts its self-fence from the send of its
 * last acknowledged keep-alive, etcd its lease from the receipt; the model has the two equal,
 * so the fence's margin is zero (in the code it covers the rates of lockd's and etcd's clocks,
 * which the model does not have: every clock here ticks together).
 *
 * The protocol:
 *   election    a follower whose etcd is reachable wins iff the election key does not exist;
 *               it gets revision R = elections + 1 (strictly increasing), its leadership
 *               lease L, and its self-fence counted from the lease grant.
 *   takeover    in the same step (the linearizable read after the election): the durable row;
 *               a Held lease is restored as refreshed now for TTL - sum(lived/j, a < j < R),
 *               a = seen/holder; nothing left: expired at once (written).
 *   writes      every ownership change (grant, release, expiry) and every mark (seen/h,
 *               lived/R) is an etcd txn guarded on "the election key's create_revision == R";
 *               it lands at once (durable, or rejected: the lockd stops, sends nothing more,
 *               and may restart as a follower) or, when the lockd is cut, never (its answers
 *               wait for ever).  lived/R is written with every batch and, while a lease is held,
 *               at least every CKPT ticks.  A slow write that lands later is not modelled apart:
 *               landing at once with its answer lost (UNRELIABLE_NETWORKS) covers it.
 *   refresh     in memory only; answered only while the self-fence is open (fence > 0); the
 *               first acknowledgement of h in an incarnation waits for seen/h = R to be durable;
 *               an entry not held by h is answered lost/unknown and the supervisor kills.
 *   grant       written with seen/h = R; answered once durable (the grant is the first
 *               acknowledgement: the supervisor's kill deadline is send + KA).
 * Etcd's lease is the one the election key is attached to (key_left); other leases of a lockd
 * matter to nobody.  A keep-alive of an expired lease fails (etcd: lease not found).
 *
 * Bounds (state space, not protocol): two lockd, one name, two holders with one grant each,
 * at most ELECTIONS leaders per run; lockd 0 wins the first election (the two are symmetric).
 * seen/h starts at 0: every worker was acknowledged by a leader before the first modelled one
 * (for its other names), so a grant that did not mark seen/h would be restored by a sum that
 * starts before the grant.  A cut lockd without a lease is not modelled apart from a deposed
 * one (it answers nothing that a follower would not: its grants wait for ever).  Not
 * modelled: a cut lockd's grants in memory (never answered; they could only make its refresh
 * answers say `lost`, which kills), a healed partition (its writes then land late: rejected,
 * or durable as if slow), clock rates.
 *
 * Switches (specs/README.md "Switches"):
 *   -DUNRELIABLE_NETWORKS  an answer may be lost after its request took effect (grant,
 *                          refresh, keep-alive); a lost request is a step not taken
 *   -DNO_SELF_FENCE        ablation: a lockd answers refreshes whether or not its leadership
 *                          lease could have expired
 *   -DTAKEOVER_FULL_TTL    ablation: the takeover restores a Held lease for a full TTL,
 *                          ignoring lived/seen
 *   -DUNGUARDED_WRITES     ablation: writes are not guarded on the leader revision
 *
 * Mutable guards and effects carry markers for specs/mutate: G = guard, E = effect.
 */

#define NOBODY 255

#ifndef TTL
#define TTL 3          /* lockd's lease TTL, in ticks */
#endif
#define KA TTL         /* the supervisor's kill_after: see "Time" above */
#ifndef LL
#define LL 2           /* the leadership lease's TTL L */
#endif
#define CKPT 2         /* the lived-checkpoint interval */
#ifndef ELECTIONS
#define ELECTIONS 3    /* leaders per run */
#endif
/* BoundedFreeing's bound, in served ticks (see the property) */
#define B (2*TTL - 2 + (CKPT - 1)*(ELECTIONS - 2))

#ifdef UNRELIABLE_NETWORKS
#define UN 1
#else
#define UN 0
#endif
#ifdef NO_SELF_FENCE
#define FENCE_OPEN(i) 1
#else
#define FENCE_OPEN(i) (fence[i] > 0)
#endif
#ifdef UNGUARDED_WRITES
#define GUARD_HOLDS(i) 1
#else
#define GUARD_HOLDS(i) (key_rev == rev[i])
#endif

/* lockd roles */
#define FOLLOWER 0
#define LEADER   1     /* won an election; also a deposed one that does not know it yet */

/* a holder's life */
#define IDLE 0
#define CRIT 1         /* its sandbox runs in its critical section */
#define DONE 2         /* exited, killed, or its grant's answer was lost */
#define DEAD 3         /* its machine died right after a refresh (or its grant) that lockd
                          applied: nothing of it runs or sends any more */

/* ---- etcd ---- */
byte key_rev;                   /* the election key's create_revision; 0: no key */
byte key_owner;                 /* the lockd whose lease the key is attached to (key_rev != 0) */
byte key_left;                  /* ticks until etcd expires that lease and deletes the key */
byte elections;                 /* revisions handed out */
byte d_holder = NOBODY;         /* the name's durable row: Held{holder} or Free */
byte d_seen[2];                 /* seen/h: the last incarnation that acknowledged h */
byte d_lived[ELECTIONS + 1];    /* lived/R: a lower bound of how long incarnation R served */

/* ---- lockd i ---- */
byte role[2];
bool cut[2];                    /* partitioned from etcd */
byte rev[2];                    /* its leader revision R */
byte fence[2];                  /* ticks its self-fence stays open: from the send of its last
                                   acknowledged keep-alive (or the lease grant) + L */
byte held[2] = NOBODY;          /* its table: the name's holder */
byte left[2];                   /* ticks until its table expires the name */
byte up[2];                     /* ticks since it won (capped at TTL) */
byte age[2];                    /* ticks since its last lived write (capped at CKPT) */
byte noted[2];                  /* bit h: seen/h = R is durable (acknowledge h at once) */

/* ---- holders ---- */
byte st[2];
byte valid[2];                  /* ticks until the kill-switch fires: send of the last
                                   acknowledged refresh (or the acquire) + KA */

/* ---- ghosts: read by the properties only ---- */
byte g_since;                   /* served ticks since the last refresh (or the grant) a lockd
                                   applied for a holder that then died, while the name's row
                                   stays Held by it (capped at B + 1) */
bool g_kept;                    /* a restored lease was refreshed by its new leader */
bool g_short;                   /* a takeover restored a lease for less than a TTL */
bool g_rejected;                /* a lockd's write was rejected */

/* scratch within one atomic step, 0 between steps (Spin's `hidden` mis-restores them) */
byte ok;                        /* the last commit was durable */
byte serving;
byte k;
byte t;                         /* the lockd a holder's request goes to */
byte j;
byte sum;

inline forget(i) {
	cut[i] = false; rev[i] = 0; fence[i] = 0; held[i] = NOBODY; left[i] = 0; up[i] = 0;
	age[i] = 0; noted[i] = 0
}

/* Forget what nothing reads any more, so that runs that differ only in it meet in one state
 * (a state-space reduction, no behaviour: every value zeroed here is read again only after a
 * write that sets it): the marks and lived rows once no further takeover reads them, a
 * finished holder's marks, a lease time without a lease, and the table of a cut lockd whose
 * fence closed (it answers nothing any more: a follower that does not campaign yet). */
inline canon() {
	if
	:: elections == ELECTIONS ->
		for (k : 1 .. ELECTIONS) { d_lived[k] = 0 };
		up[0] = 0; up[1] = 0; d_seen[0] = 0; d_seen[1] = 0
	:: else
	fi;
	for (k : 0 .. 1) {
		if
		:: st[k] == DONE || st[k] == DEAD ->
			noted[0] = noted[0] & ~(1 << k); noted[1] = noted[1] & ~(1 << k);
			if :: d_holder != k -> d_seen[k] = 0 :: else fi
		:: else
		fi
	};
	for (k : 0 .. 1) {
		if :: held[k] == NOBODY -> left[k] = 0 :: else fi;
		if :: cut[k] && !FENCE_OPEN(k) -> forget(k); role[k] = FOLLOWER :: else fi
	};
	if :: d_holder == NOBODY || st[d_holder] != DEAD -> g_since = 0 :: else fi;
	k = 0
}

/* EtcdStore::commit: one txn "if create_revision(election key) == R then <batch>", with
 * lived/R; sets ok when durable */
inline commit(i) {
	if
	:: cut[i] -> ok = false                 /* never lands; its answers wait for ever */
	:: else ->
		if
		:: /*@G guarded*/ GUARD_HOLDS(i) ->
			ok = true; /*@E lived_batch*/ d_lived[rev[i]] = up[i]; age[i] = 0
		:: else ->                          /* rejected: stop serving; lockd exits 1 and is
			                                       restarted as a follower */
			ok = false; forget(i); /*@E rejected_stops*/ role[i] = FOLLOWER; g_rejected = true
		fi
	fi
}

/* ---- Clock: one tick ---- */
proctype Clock()
{
end_idle:
	do
	:: atomic {
		serving = (key_rev != 0 && role[key_owner] == LEADER && !cut[key_owner] &&
		           rev[key_owner] == key_rev);
		/* the supervisors' kill-switches (DeadlineWheel: last acknowledged send + kill_after) */
		for (k : 0 .. 1) {
			if
			:: st[k] == CRIT ->
				/*@E killswitch_clock*/ valid[k]--;
				if :: /*@G killswitch*/ valid[k] == 0 -> /*@E kill*/ st[k] = DONE :: else fi
			:: else
			fi
		};
		/* each lockd that believes it leads */
		for (k : 0 .. 1) {
			if
			:: role[k] == LEADER ->
				if :: !cut[k] && up[k] < TTL -> /*@E lived_clock*/ up[k]++ :: else fi;
				if :: fence[k] > 0 -> /*@E fence_clock*/ fence[k]-- :: else fi;
				if
				:: held[k] != NOBODY ->
					/*@E lease_clock*/ left[k]--;
					if
					:: /*@G expires*/ left[k] == 0 ->     /* LeaseTable::advance: expiry, written */
						/*@E expire*/ held[k] = NOBODY;
						commit(k);
						if :: ok -> /*@E expire_durable*/ d_holder = NOBODY :: else fi
					:: else ->
						if
						:: !cut[k] ->                     /* the lived checkpoint */
							age[k]++;
							if :: /*@G checkpoint_due*/ age[k] >= CKPT -> commit(k) :: else fi
						:: else
						fi
					fi
				:: else -> age[k] = 0
				fi
			:: else
			fi
		};
		/* etcd: the leadership lease expires, the election key is deleted */
		if
		:: key_rev != 0 ->
			key_left--;
			if :: key_left == 0 -> key_rev = 0; key_owner = 0 :: else fi
		:: else
		fi;
		if
		:: serving && d_holder != NOBODY && st[d_holder] == DEAD && g_since <= B -> g_since++
		:: else
		fi;
		serving = false; ok = false;
		canon()
	   }
	od
}

/* ---- the takeover: LockService::LockService restoring the shard's rows ---- */
inline takeover(i) {
	/*@E restore_row*/ held[i] = d_holder;
	if
	:: held[i] != NOBODY ->
		sum = 0;
#ifndef TAKEOVER_FULL_TTL
		for (j : d_seen[held[i]] + 1 .. rev[i] - 1) { /*@E lived_sum*/ sum = sum + d_lived[j] };
#endif
		if
		:: /*@G nothing_left*/ sum >= TTL ->       /* expires at once */
			held[i] = NOBODY; commit(i);
			if :: ok -> /*@E restore_expire*/ d_holder = NOBODY :: else fi
		:: else -> /*@E restore_left*/ left[i] = TTL - sum; g_short = g_short || sum > 0
		fi
	:: else
	fi;
	sum = 0; j = 0; ok = false
}

/* ---- Lockd(i) ---- */
proctype Lockd(byte i)
{
end_idle:
	do
	:: atomic {    /* Leadership::campaign: lease grant, then create the key iff absent */
		role[i] == FOLLOWER && elections < ELECTIONS && (elections > 0 || i == 0) &&
		/*@G campaign_free*/ key_rev == 0 ->
		elections++;
		key_rev = elections; key_owner = i; key_left = LL;
		role[i] = LEADER; /*@E campaign_rev*/ rev[i] = elections;
		/*@E campaign_fence*/ fence[i] = LL;          /* from the lease grant's send */
		takeover(i);
		canon()
	   }
	:: atomic {    /* a keep-alive of the leadership lease (Leadership::serving's clock) */
		role[i] == LEADER && !cut[i] && key_rev == rev[i] ->
		key_left = LL;
		if
		:: /*@E keepalive_fence*/ fence[i] = LL
		:: UN -> skip                                 /* its answer is lost */
		fi
	   }
	:: atomic {    /* partitioned from etcd while holding a lease: runs on, from memory */
		role[i] == LEADER && !cut[i] && held[i] != NOBODY -> cut[i] = true; up[i] = 0; age[i] = 0
	   }
	:: atomic {    /* a cut lockd crashes and is restarted */
		cut[i] -> forget(i); role[i] = FOLLOWER
	   }
	od
}

/* ---- Holder(h): the supervisor's requests to lockd i ---- */
inline acquire(h, i) {
	if
	:: role[i] == LEADER && !cut[i] && /*@G acquire_free*/ held[i] == NOBODY ->
		/*@E grant*/ held[i] = h; left[i] = TTL;
		commit(i);
		if
		:: ok ->
			/*@E grant_durable*/ d_holder = h;
			/*@E grant_seen*/ d_seen[h] = rev[i];
			noted[i] = noted[i] | (1 << h);
			if
			:: /*@E granted*/ st[h] = CRIT; valid[h] = KA
			:: UN -> st[h] = DONE                 /* the answer is lost: never starts */
			:: st[h] = DEAD                       /* the machine dies right after */
			fi
		:: else                                   /* no answer */
		fi
	:: else                                       /* refused, not_leader, or no answer */
	fi;
	ok = false
}

inline heartbeat(h, i) {
	if
	:: role[i] == LEADER && /*@G self_fence*/ FENCE_OPEN(i) ->
		if
		:: /*@G refresh_holds*/ held[i] == h ->
			if
			:: /*@G seen_known*/ (noted[i] & (1 << h)) != 0 -> ok = true
			:: else ->                            /* first acknowledgement in this incarnation */
				commit(i);
				if
				:: ok ->
					/*@E seen_mark*/ d_seen[h] = rev[i];
					noted[i] = noted[i] | (1 << h);
					g_kept = true
				:: else
				fi
			fi;
			if
			:: ok ->
				/*@E refresh*/ left[i] = TTL;
				if
				:: /*@E refreshed*/ valid[h] = KA
				:: UN -> skip                     /* the answer is lost */
				:: st[h] = DEAD; valid[h] = 0     /* the machine dies right after */
				fi
			:: else                               /* no answer */
			fi
		:: else ->                                /* lost / unknown: kill at once */
			/*@E recovery*/ st[h] = DONE; valid[h] = 0
		fi
	:: else                                       /* not_leader, or silent past its fence */
	fi;
	ok = false
}

inline release_at(h, i) {
	if
	:: role[i] == LEADER && !cut[i] && /*@G release_holds*/ held[i] == h ->
		/*@E release*/ held[i] = NOBODY;
		commit(i);
		if :: ok -> /*@E release_durable*/ d_holder = NOBODY :: else fi
	:: else
	fi;
	ok = false
}

proctype Holder(byte h)
{
end_idle:
	do
	:: atomic { st[h] == IDLE -> if :: t = 0 :: t = 1 fi; acquire(h, t); t = 0; canon() }
	:: atomic { st[h] == CRIT -> if :: t = 0 :: t = 1 fi; heartbeat(h, t); t = 0; canon() }
	:: atomic {    /* the sandbox exits; the release goes to either lockd, or is lost */
		st[h] == CRIT -> st[h] = DONE; valid[h] = 0;
		if
		:: t = 0; release_at(h, t)
		:: t = 1; release_at(h, t)
		:: skip
		fi;
		t = 0; canon()
	   }
	od
}

init {
	atomic { run Clock(); run Lockd(0); run Lockd(1); run Holder(0); run Holder(1) }
}

/* ---- properties ---- */

/* MutualExclusion: never two sandboxes in their critical sections (a killed one is DONE). */
ltl MutualExclusion { [] !(st[0] == CRIT && st[1] == CRIT) }

/* BoundedFreeing: a name whose holder's heartbeats stopped reaching lockd is Free (its row
 * written Free, so any leader may grant it) within B ticks of served leader time after the
 * last refresh a lockd applied, however many failovers happen (up to ELECTIONS leaders).  A
 * tick is served when the election key's owner runs, believes it leads and reaches etcd.
 * B = (TTL - 1) in the incarnation of that refresh + (TTL - 1) from the next takeover on,
 * + (CKPT - 1) of lived time lost per incarnation in between. */
ltl BoundedFreeing { [] (g_since <= B) }

/* FenceWithinLease: a lockd whose self-fence is open is the election key's owner (Leadership::
 * serving never outlives the etcd lease). */
ltl FenceWithinLease {
	[] ((role[0] != LEADER || fence[0] == 0 || key_rev == rev[0]) &&
	    (role[1] != LEADER || fence[1] == 0 || key_rev == rev[1]))
}

/* Non-vacuity (expected to FAIL). */
ltl NeverGranted { [] (st[0] != CRIT && st[1] != CRIT) }
ltl NeverHandedOver { [] !((st[0] == CRIT && st[1] >= DONE) || (st[1] == CRIT && st[0] >= DONE)) }
ltl NeverFailover { [] (elections < 2) }
/* a live lease restored at a takeover is refreshed by the new leader */
ltl NeverKeptAcrossFailover { [] !g_kept }
/* a takeover restores a lease for less than a TTL, but not nothing (the lived sum at work) */
ltl NeverShortened { [] !g_short }
/* a deposed lockd's write is rejected and it stops */
ltl NeverRejected { [] !g_rejected }
/* B is tight: a name is held for B served ticks after its last refresh */
ltl NeverAtBound { [] (g_since < B) }
