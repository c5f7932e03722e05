/*
 * leasehold, model 1: the lease (DESIGN.md "Lock states", lease mode; "Time"; supervisor
 * kill-switch; mutex violation recovery).
 *
 * One name, N sandboxes that all want it.  Five kinds of process:
 *   Creation(s)   schedule a named sandbox (acquire the name, then spawn it) or name an
 *                 existing unnamed sandbox (acquire; it is already running).  Weakly fair.
 *   Sandbox(s)    the running sandbox: critical section, release, terminate.  NOT fair: it
 *                 chooses up front whether it ever releases (see "Fairness" below).
 *   Heartbeat(s)  the supervisor refreshing s's lease: refreshed, the name is held by
 *                 someone else (recovery: kill s at once), or a network failure.  Weakly fair.
 *   Sweep         the supervisor's kill-switch: kill a critical sandbox whose latest
 *                 heartbeat failed.  Weakly fair; visits the sandboxes round-robin.
 *   Expiry        lockd's TTL: every tick either consumes the last refresh or frees the name.
 *                 Weakly fair.
 *
 * Time is not counted (timing guards read only ghost history variables, g_*).  Expiry ticks cut time into TTL periods and only the orderings the
 * timing budget guarantees are modelled, each as a guard that waits for the earlier event:
 *   HeartbeatBeforeSweep   in every period a heartbeat attempt for s precedes the sweep's
 *                          judgement of s           (heartbeat cadence < kill_after)
 *   SweepBeforeExpiry      a period ends only after the sweep judged every critical sandbox
 *                          in it                    (kill_after + margins < ttl)
 *   AcquiringBeforeExpiry  no period ends while a sandbox is being scheduled
 *                          (ttl > worst-case scheduling latency)
 * With -DUNRELIABLE_TIMING every guard is disjoined with true: any ordering may happen
 * (a supervisor pause longer than the pause budget, a slow scheduler).
 * With -DUNRELIABLE_NETWORKS a heartbeat may lose its request or its answer.
 *
 * Revoke (Operator): the name becomes Free at epoch + 1 but stays ungrantable (lock-delay)
 * until the holder's supervisor confirmed the kill (the answer to the pushed revocation) or
 * the old lease's expiry passed; a heartbeat of the revoked holder is answered lost (recovery).
 *
 * Ablations (each must break a property; specs/expected.tsv says which):
 *   -DREVOKE_FREES_AT_ONCE        revoke makes the name grantable at once (no lock-delay)
 *   -DNO_RECOVERY                 the heartbeat does not kill a sandbox whose name is held
 *                                 by someone else
 *   -DNO_ACQUIRING_BEFORE_EXPIRY  the name may expire while its sandbox is being scheduled
 *
 * Fairness: pan -f makes every process weakly fair, the sandbox included.  A sandbox that
 * is fair would eventually release, which would make EventualMutualExclusion hold with no
 * recovery at all.  So the sandbox's first step is a free choice between "release when done"
 * and "run forever" (a blocked end state that fairness cannot force past).  Every finite
 * delay before a release is still possible on the first branch.
 */

#define N 2            /* sandboxes; ALL_SWEPT and the ltl formulas are written out for two */
#define NOBODY 255

#ifdef UNRELIABLE_TIMING
#define UT 1
#else
#define UT 0
#endif
#ifdef UNRELIABLE_NETWORKS
#define UN 1
#else
#define UN 0
#endif

/* sandbox life cycle */
#define INIT       0   /* not started / not yet named */
#define SCHEDULING 1   /* name acquired, sandbox being scheduled */
#define RUNNING    2
#define DONE       3   /* terminated, killed, or never started */

byte lock = NOBODY;     /* holder of the name (lockd) */
bool refreshed;         /* lockd: a refresh arrived since the last expiry tick */
byte proc[N];
bool critical[N];
bool hb_failed[N];      /* the supervisor saw s's latest heartbeat fail */
byte rv = NOBODY;       /* lockd: revoked from rv; lock-delay until the kill is confirmed
                           or the old lease expired */
bool push[N];           /* a revocation pushed to s's supervisor is in flight */

/* ghosts: history of the run, never implementation state (the timing guards use only
 * these, so a bug in how the implementation keeps its flags cannot weaken them) */
bool g_hb_attempted[N]; /* a heartbeat attempt for s in the current TTL period */
bool g_swept[N];        /* the sweep judged s in the current TTL period */
bool g_scheduling[N];   /* s's name was granted and s is not placed yet */
bool g_was_critical[N]; /* s was in its critical section */
bool g_handover;        /* a sandbox entered its critical section after the other had been */

#define HOLDS(s)      (lock == (s))
/* the name cannot go to anyone else: s holds it, or it was revoked from s and the
 * lock-delay has not ended */
#define COVERED(s)    (HOLDS(s) || rv == (s))
#define ALL_SWEPT     ((!critical[0] || g_swept[0]) && (!critical[1] || g_swept[1]))
#ifdef NO_ACQUIRING_BEFORE_EXPIRY
#define NONE_SCHEDULING 1
#else
#define NONE_SCHEDULING (!g_scheduling[0] && !g_scheduling[1])
#endif
#define ENTER(s)      critical[s] = true; g_handover = g_handover || g_was_critical[1 - (s)]; \
                      g_was_critical[s] = true

/* ---- Creation: the name is acquired before the sandbox is scheduled ---- */
proctype Creation(byte s)
{
	if
	:: true ->  /* schedule a named sandbox: LeaseTable::acquire, then spawn */
	   atomic {
		if
		:: /*@G acquire_free*/ lock == NOBODY && rv == NOBODY ->
			/*@E acquire*/ lock = s; /*@E acquire_refreshed*/ refreshed = true;
			proc[s] = SCHEDULING; g_scheduling[s] = true
		:: else -> proc[s] = DONE      /* a sandbox whose name is refused never starts */
		fi
	   };
	   /* the scheduler places it; the name may already be gone (only if timing failed) */
	   atomic { proc[s] == SCHEDULING -> proc[s] = RUNNING; ENTER(s); g_scheduling[s] = false }
	:: true ->  /* name an existing, running, unnamed sandbox: LeaseTable::acquire */
	   atomic {
		if
		:: /*@G name_free*/ lock == NOBODY && rv == NOBODY ->
			/*@E name*/ lock = s; refreshed = true; proc[s] = RUNNING; ENTER(s)
		:: else -> proc[s] = DONE      /* stays unnamed: out of this model */
		fi
	   }
	fi
}

/* ---- Sandbox: not fair ---- */
proctype Sandbox(byte s)
{
	if
	:: true ->
end_forever:	false                  /* never releases; only a kill ends it */
	:: true
	fi;
end_critical:
	/* Release: leave the critical section and release the name (LeaseTable::release) */
	atomic { critical[s] -> critical[s] = false; if :: /*@G release_holds*/ HOLDS(s) -> /*@E release*/ lock = NOBODY :: else fi };
	/* Terminate */
	proc[s] = DONE
}

/* ---- Heartbeat: the supervisor refreshes s's lease (LeaseTable::refresh) ---- */
proctype Heartbeat(byte s)
{
end_idle:
	do
	:: atomic {
		critical[s] ->
		g_hb_attempted[s] = true;
		if
		:: /* delivered and answered */
		   /*@E hb_ok*/ hb_failed[s] = false;
		   if
		   :: /*@G refresh_holds*/ HOLDS(s) -> /*@E refresh*/ refreshed = true
		   :: else ->
#ifndef NO_RECOVERY
			/* answer is lost{holder} / unknown: mutex violation recovery; a revoked
			   holder's kill is then confirmed as after the push (unless that is lost) */
			/*@E recovery*/ critical[s] = false; proc[s] = DONE;
			if
			:: UN -> skip
			:: /*@G confirm_lost*/ rv == s -> /*@E confirm_lost_clears*/ rv = NOBODY
			:: else
			fi
#else
			skip
#endif
		   fi
		:: UN -> /*@E hb_lost*/ hb_failed[s] = true                     /* request lost */
		:: UN && HOLDS(s) -> hb_failed[s] = true; refreshed = true   /* answer lost */
		fi
	   }
	od
}

/* ---- Sweep: the kill-switch (DeadlineWheel fires, KillSwitch kills) ---- */
proctype Sweep()
{
	byte s = 0;
end_idle:
	do
	:: atomic {
		/*@G hb_before_sweep*/ (!critical[s] || g_hb_attempted[s] || UT) ->   /* HeartbeatBeforeSweep */
		if
		:: critical[s] ->
			if
			:: /*@G sweep_failed*/ hb_failed[s] -> /*@E sweep_kill*/ critical[s] = false; proc[s] = DONE
			:: else
			fi;
			g_swept[s] = true
		:: else
		fi;
		s = (s + 1) % N
	   }
	od
}

/* ---- Expiry: lockd's TTL (LeaseTable::advance) ---- */
proctype Expiry()
{
	byte i;
end_idle:
	do
	:: atomic {
		(lock != NOBODY || rv != NOBODY) &&
		/*@G sweep_before_expiry*/ (UT || (ALL_SWEPT && NONE_SCHEDULING)) ->    /* SweepBeforeExpiry, AcquiringBeforeExpiry */
		if
		:: /*@G expiry_refreshed*/ refreshed -> /*@E consume*/ refreshed = false
		:: else ->
			/*@E expire*/ lock = NOBODY;
			/*@E delay_ends*/ rv = NOBODY      /* the revoked lease's expiry: lock-delay ends */
		fi;
		/* a new TTL period starts */
		for (i : 0 .. N-1) { g_hb_attempted[i] = false; g_swept[i] = false };
		i = 0
	   }
	od
}

/* ---- Operator: one revoke (LockService::on_revoke, LeaseTable::revoke) and its push ---- */
proctype Operator()
{
	byte s;
	bool done;
end_idle:
	do
	:: atomic {    /* leasehold revoke: Free at epoch + 1, ungrantable until confirmed */
		!done && lock != NOBODY ->
		done = true; s = lock;
#ifndef REVOKE_FREES_AT_ONCE
		/*@E revoke_delay*/ rv = s;
#endif
		/*@E revoke_frees*/ lock = NOBODY;
		/*@E push*/ push[s] = true
	   }
	:: atomic {    /* the pushed revocation reaches s's supervisor: kill, confirm */
		push[s] ->
		push[s] = false;
		if
		:: UN -> skip                   /* lost, or its confirmation lost: expiry ends it */
		:: true ->
			/*@E push_kill*/ critical[s] = false;
			/* a sandbox still being placed is abandoned as well */
			if :: proc[s] == RUNNING || proc[s] == SCHEDULING -> proc[s] = DONE; g_scheduling[s] = false :: else fi;
			if :: /*@G confirm*/ rv == s -> /*@E confirm_clears*/ rv = NOBODY :: else fi
		fi
	   }
	od
}

init {
	atomic {
		byte k;
		for (k : 0 .. N-1) {
			run Creation(k); run Sandbox(k); run Heartbeat(k)
		};
		run Sweep(); run Expiry(); run Operator()
	}
}

/* ---- properties ---- */

/* MutualExclusion: a sandbox in its critical section is covered by the name: it holds it,
 * or the name was revoked from it and the lock-delay has not ended. */
ltl MutualExclusion { [] ((!critical[0] || COVERED(0)) && (!critical[1] || COVERED(1))) }

/* Liveness: a sandbox holding the name outside its critical section eventually enters it
 * or loses the name. */
ltl Liveness {
	[] ((!critical[0] && HOLDS(0)) -> <> (critical[0] || !HOLDS(0))) &&
	[] ((!critical[1] && HOLDS(1)) -> <> (critical[1] || !HOLDS(1)))
}

/* EventualMutualExclusion: a critical sandbox that does not hold the name (it was taken by
 * expiry or revoke) eventually leaves its critical section for good. */
ltl EventualMutualExclusion {
	[] ((critical[0] && !HOLDS(0)) -> <> [] !critical[0]) &&
	[] ((critical[1] && !HOLDS(1)) -> <> [] !critical[1])
}

/* RevokeEnds: a revoke's lock-delay ends (kill confirmed, or the old lease expired). */
ltl RevokeEnds { [] ((rv != NOBODY) -> <> (rv == NOBODY)) }

/* Non-vacuity (expected to FAIL): a sandbox does reach its critical section, and one does
 * after the other had been in it. */
ltl NeverCritical { [] !(critical[0] || critical[1]) }
ltl NeverHandedOver { [] !g_handover }
