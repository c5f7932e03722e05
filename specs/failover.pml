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
byte expiry_in[2];              /* ticks until its table expires the name */
byte uptime[2];                 /* ticks since it won (capped at TTL) */
byte ckpt_age[2];               /* ticks since its last lived write (capped at CKPT) */
byte noted[2];                  /* bit h: seen/h = R is durable (acknowledge h at once) */

/* ---- holders ---- */
byte life[2];
byte kill_in[2];                /* ticks until the kill-switch fires: send of the last
                                   acknowledged refresh (or the acquire) + KA */

/* ---- ghosts: read by the properties only ---- */
/* the name is not free although its holder stopped for good: its row, or the table of the
 * election key's owner, holds it for a holder that is DONE or DEAD */
#define STOPPED_IN(x) ((x) != NOBODY && life[x] >= DONE)
#define UNFREE (STOPPED_IN(d_holder) || (key_rev != 0 && STOPPED_IN(held[key_owner])))
byte g_since;                   /* served ticks while UNFREE: since the refresh (or grant)
                                   right after which the holder's machine died, or since its
                                   sandbox exited or was killed (capped at B + 1) */
bool g_kept;                    /* a restored lease was refreshed by its new leader */
bool g_short;                   /* a takeover restored a lease for less than a TTL */
bool g_rejected;                /* a lockd's write was rejected */

/* scratch within one atomic step, 0 between steps (not `hidden`: pan read stale indexes) */
byte s_ok;                      /* the last commit was durable */
byte s_serving;
byte s_k;
byte s_to;                      /* the lockd a holder's request goes to */
byte s_j;
byte s_sum;

inline forget(i) {
	cut[i] = false; rev[i] = 0; fence[i] = 0; held[i] = NOBODY; expiry_in[i] = 0; uptime[i] = 0;
	ckpt_age[i] = 0; noted[i] = 0
}

/* Forget what nothing reads any more, so that runs that differ only in it meet in one state
 * (a state-space reduction, no behaviour: every value zeroed here is read again only after a
 * write that sets it): the marks and lived rows once no further takeover reads them, a
 * finished holder's marks, a lease time without a lease, and the table of a cut lockd whose
 * fence closed (it answers nothing any more: a follower that does not campaign yet). */
inline canon() {
	if
	:: elections == ELECTIONS ->
		for (s_k : 1 .. ELECTIONS) { d_lived[s_k] = 0 };
		uptime[0] = 0; uptime[1] = 0; d_seen[0] = 0; d_seen[1] = 0
	:: else
	fi;
	for (s_k : 0 .. 1) {
		if
		:: life[s_k] == DONE || life[s_k] == DEAD ->
			kill_in[s_k] = 0;
			noted[0] = noted[0] & ~(1 << s_k); noted[1] = noted[1] & ~(1 << s_k);
			if :: d_holder != s_k -> d_seen[s_k] = 0 :: else fi
		:: else
		fi
	};
	for (s_k : 0 .. 1) {
		if :: held[s_k] == NOBODY -> expiry_in[s_k] = 0 :: else fi;
		if :: cut[s_k] && !FENCE_OPEN(s_k) -> forget(s_k); role[s_k] = FOLLOWER :: else fi
	};
	if :: !UNFREE -> g_since = 0 :: else fi;
	s_k = 0
}

/* EtcdStore::commit: one txn "if create_revision(election key) == R then <batch>", with
 * lived/R; s_ok when durable */
inline commit(i) {
	if
	:: cut[i] -> s_ok = false               /* never lands; its answers wait for ever */
	:: else ->
		if
		:: /*@G guarded*/ GUARD_HOLDS(i) ->
			s_ok = true; /*@E lived_batch*/ d_lived[rev[i]] = uptime[i]; ckpt_age[i] = 0
		:: else ->              /* rejected: stop serving; lockd exits 1, restarts a follower */
			s_ok = false; forget(i); /*@E rejected_stops*/ role[i] = FOLLOWER; g_rejected = true
		fi
	fi
}

/* ---- Clock: one tick ---- */
proctype Clock()
{
end_idle:
	do
	:: atomic {
		s_serving = (key_rev != 0 && role[key_owner] == LEADER && !cut[key_owner] &&
		             rev[key_owner] == key_rev);
		/* the supervisors' kill-switches (DeadlineWheel: last acknowledged send + kill_after) */
		for (s_k : 0 .. 1) {
			if
			:: life[s_k] == CRIT ->
				if
				:: kill_in[s_k] > 0 -> /*@E killswitch_clock*/ kill_in[s_k] = kill_in[s_k] - 1
				:: else
				fi;
				if :: /*@G killswitch*/ kill_in[s_k] == 0 -> /*@E kill*/ life[s_k] = DONE :: else fi
			:: else
			fi
		};
		/* each lockd that believes it leads */
		for (s_k : 0 .. 1) {
			if
			:: role[s_k] == LEADER ->
				if
				:: !cut[s_k] && uptime[s_k] < TTL -> /*@E lived_clock*/ uptime[s_k] = uptime[s_k] + 1
				:: else
				fi;
				if :: fence[s_k] > 0 -> /*@E fence_clock*/ fence[s_k] = fence[s_k] - 1 :: else fi;
				if
				:: held[s_k] != NOBODY ->
					if
					:: expiry_in[s_k] > 0 ->
						/*@E lease_clock*/ expiry_in[s_k] = expiry_in[s_k] - 1
					:: else
					fi;
					if
					:: /*@G expires*/ expiry_in[s_k] == 0 -> /* LeaseTable::advance: expiry, written */
						/*@E expire*/ held[s_k] = NOBODY;
						commit(s_k);
						if :: s_ok -> /*@E expire_durable*/ d_holder = NOBODY :: else fi
					:: else ->
						if
						:: !cut[s_k] ->                 /* the lived checkpoint */
							ckpt_age[s_k]++;
							if :: /*@G checkpoint_due*/ ckpt_age[s_k] >= CKPT -> commit(s_k) :: else fi
						:: else
						fi
					fi
				:: else -> ckpt_age[s_k] = 0
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
		:: s_serving && UNFREE && g_since <= B -> g_since++
		:: else
		fi;
		s_serving = false; s_ok = false;
		canon()
	   }
	od
}

/* ---- the takeover: LockService::LockService restoring the shard's rows ---- */
inline takeover(i) {
	/*@E restore_row*/ held[i] = d_holder;
	if
	:: held[i] != NOBODY ->
		s_sum = 0;
#ifndef TAKEOVER_FULL_TTL
		for (s_j : d_seen[held[i]] + 1 .. rev[i] - 1) {
			/*@E lived_sum*/ s_sum = s_sum + d_lived[s_j]
		};
#endif
		if
		:: /*@G nothing_left*/ s_sum >= TTL ->     /* expires at once */
			held[i] = NOBODY; commit(i);
			if :: s_ok -> /*@E restore_expire*/ d_holder = NOBODY :: else fi
		:: else ->
			/*@E restore_left*/ expiry_in[i] = TTL - s_sum;
			g_short = g_short || s_sum > 0
		fi
	:: else
	fi;
	s_sum = 0; s_j = 0; s_ok = false
}

/* ---- Lockd(i) ---- */
proctype Lockd(byte i)
{
end_idle:
	do
	:: atomic {    /* LeadershipCore::campaign: lease grant, then create the key iff absent */
		role[i] == FOLLOWER && elections < ELECTIONS && (elections > 0 || i == 0) &&
		/*@G campaign_free*/ key_rev == 0 ->
		elections++;
		key_rev = elections; key_owner = i; key_left = LL;
		role[i] = LEADER; /*@E campaign_rev*/ rev[i] = elections;
		/*@E campaign_fence*/ fence[i] = LL;          /* from the lease grant's send */
		takeover(i);
		canon()
	   }
	:: atomic {    /* a keep-alive of the leadership lease (LeadershipCore::serving's clock) */
		role[i] == LEADER && !cut[i] && key_rev == rev[i] ->
		key_left = LL;
		if
		:: /*@E keepalive_fence*/ fence[i] = LL
		:: UN -> skip                                 /* its answer is lost */
		fi
	   }
	:: atomic {    /* partitioned from etcd while holding a lease: runs on, from memory */
		role[i] == LEADER && !cut[i] && held[i] != NOBODY ->
		cut[i] = true; uptime[i] = 0; ckpt_age[i] = 0
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
		/*@E grant*/ held[i] = h; expiry_in[i] = TTL;
		commit(i);
		if
		:: s_ok ->
			/*@E grant_durable*/ d_holder = h;
			noted[i] = noted[i] | (1 << h);       /* seen/h = R is in this batch */
			/*@E grant_seen*/ d_seen[h] = rev[i];
			if
			:: /*@E granted*/ life[h] = CRIT; kill_in[h] = KA
			:: UN -> life[h] = DONE               /* the answer is lost: never starts */
			:: life[h] = DEAD                     /* the machine dies right after */
			fi
		:: else                                   /* no answer */
		fi
	:: else                                       /* refused, not_leader, or no answer */
	fi;
	s_ok = false
}

inline heartbeat(h, i) {
	if
	:: role[i] == LEADER && /*@G self_fence*/ FENCE_OPEN(i) ->
		if
		:: /*@G refresh_holds*/ held[i] == h ->
			if
			:: /*@G seen_known*/ (noted[i] & (1 << h)) != 0 -> s_ok = true
			:: else ->                            /* first acknowledgement in this incarnation */
				commit(i);
				if
				:: s_ok ->
					/*@E seen_mark*/ d_seen[h] = rev[i];
					noted[i] = noted[i] | (1 << h);
					g_kept = true
				:: else
				fi
			fi;
			if
			:: s_ok ->
				/*@E refresh*/ expiry_in[i] = TTL;
				if
				:: /*@E refreshed*/ kill_in[h] = KA
				:: UN -> skip                     /* the answer is lost */
				:: life[h] = DEAD                 /* the machine dies right after */
				fi
			:: else                               /* no answer */
			fi
		:: else ->                                /* lost / unknown: kill at once */
			/*@E recovery*/ life[h] = DONE
		fi
	:: else                                       /* not_leader, or silent past its fence */
	fi;
	s_ok = false
}

inline release_at(h, i) {
	if
	:: role[i] == LEADER && !cut[i] && /*@G release_holds*/ held[i] == h ->
		/*@E release*/ held[i] = NOBODY;
		commit(i);
		if :: s_ok -> /*@E release_durable*/ d_holder = NOBODY :: else fi
	:: else
	fi;
	s_ok = false
}

proctype Holder(byte h)
{
end_idle:
	do
	:: atomic {
		life[h] == IDLE -> if :: s_to = 0 :: s_to = 1 fi; acquire(h, s_to); s_to = 0; canon()
	   }
	:: atomic {
		life[h] == CRIT -> if :: s_to = 0 :: s_to = 1 fi; heartbeat(h, s_to); s_to = 0; canon()
	   }
	:: atomic {    /* the sandbox exits; the release goes to either lockd, or is lost */
		life[h] == CRIT -> life[h] = DONE;
		if
		:: s_to = 0; release_at(h, s_to)
		:: s_to = 1; release_at(h, s_to)
		:: skip
		fi;
		s_to = 0; canon()
	   }
	od
}

init {
	atomic { run Clock(); run Lockd(0); run Lockd(1); run Holder(0); run Holder(1) }
}

/* ---- properties ---- */

/* MutualExclusion: never two sandboxes in their critical sections (a killed one is DONE). */
ltl MutualExclusion { [] !(life[0] == CRIT && life[1] == CRIT) }

/* BoundedFreeing: a name whose holder stopped for good is free (neither its row nor the
 * serving leader's table holds it: that leader grants it) within B ticks of served leader
 * time, however many failovers happen (up to ELECTIONS leaders).  Counted from the last
 * refresh a lockd applied when the holder's machine died right after it (DEAD), and from the
 * stop when its sandbox exited or was killed (its supervisor sends nothing for it any more).
 * A tick is served when the election key's owner runs, believes it leads and reaches etcd.
 * B = (TTL - 1) in the incarnation of that refresh + (TTL - 1) from the next takeover on +
 * (CKPT - 1) of lived time lost per incarnation in between; NeverAtBound shows that it is
 * reached. */
ltl BoundedFreeing { [] (g_since <= B) }

/* FenceWithinLease: a lockd whose self-fence is open is the election key's owner (Leadership::
 * serving never outlives the etcd lease). */
ltl FenceWithinLease {
	[] ((role[0] != LEADER || fence[0] == 0 || key_rev == rev[0]) &&
	    (role[1] != LEADER || fence[1] == 0 || key_rev == rev[1]))
}

/* Non-vacuity (expected to FAIL). */
ltl NeverGranted { [] (life[0] != CRIT && life[1] != CRIT) }
ltl NeverHandedOver {
	[] !((life[0] == CRIT && life[1] >= DONE) || (life[1] == CRIT && life[0] >= DONE))
}
ltl NeverFailover { [] (elections < 2) }
/* a live lease restored at a takeover is refreshed by the new leader */
ltl NeverKeptAcrossFailover { [] !g_kept }
/* a takeover restores a lease for less than a TTL, but not nothing (the lived sum at work) */
ltl NeverShortened { [] !g_short }
/* a deposed lockd's write is rejected and it stops */
ltl NeverRejected { [] !g_rejected }
/* B is tight: a name is held for B served ticks after its last refresh */
ltl NeverAtBound { [] (g_since < B) }
/* a leader's fence is still open after it served L ticks: keep-alive answers extend it */
ltl NeverRenewed {
	[] !((role[0] == LEADER && !cut[0] && uptime[0] >= LL && fence[0] > 0) ||
	     (role[1] == LEADER && !cut[1] && uptime[1] >= LL && fence[1] > 0))
}
