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
 * Time is not counted.  Expiry ticks cut time into TTL periods and only the orderings the
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
 * Ablations (each must break a property; specs/expected.tsv says which):
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
bool hb_attempted[N];   /* a heartbeat attempt for s in the current TTL period */
bool hb_failed[N];      /* the supervisor saw s's latest heartbeat fail */
bool swept[N];          /* the sweep judged s in the current TTL period */

#define HOLDS(s)      (lock == (s))
#define ALL_SWEPT     ((!critical[0] || swept[0]) && (!critical[1] || swept[1]))
#ifdef NO_ACQUIRING_BEFORE_EXPIRY
#define NONE_SCHEDULING 1
#else
#define NONE_SCHEDULING (proc[0] != SCHEDULING && proc[1] != SCHEDULING)
#endif

/* ---- Creation: the name is acquired before the sandbox is scheduled ---- */
proctype Creation(byte s)
{
	if
	:: true ->  /* schedule a named sandbox: LeaseTable::acquire, then spawn */
	   atomic {
		if
		:: lock == NOBODY -> lock = s; refreshed = true; proc[s] = SCHEDULING
		:: else -> proc[s] = DONE      /* a sandbox whose name is refused never starts */
		fi
	   };
	   /* the scheduler places it; the name may already be gone (only if timing failed) */
	   atomic { proc[s] == SCHEDULING -> proc[s] = RUNNING; critical[s] = true }
	:: true ->  /* name an existing, running, unnamed sandbox: LeaseTable::acquire */
	   atomic {
		if
		:: lock == NOBODY -> lock = s; refreshed = true; proc[s] = RUNNING; critical[s] = true
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
	atomic { critical[s] -> critical[s] = false; if :: HOLDS(s) -> lock = NOBODY :: else fi };
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
		hb_attempted[s] = true;
		if
		:: /* delivered and answered */
		   hb_failed[s] = false;
		   if
		   :: HOLDS(s) -> refreshed = true
		   :: else ->
#ifndef NO_RECOVERY
			/* answer is lost{holder} / unknown: mutex violation recovery */
			critical[s] = false; proc[s] = DONE
#else
			skip
#endif
		   fi
		:: UN -> hb_failed[s] = true                     /* request lost */
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
		(!critical[s] || hb_attempted[s] || UT) ->   /* HeartbeatBeforeSweep */
		if
		:: critical[s] ->
			if
			:: hb_failed[s] -> critical[s] = false; proc[s] = DONE
			:: else
			fi;
			swept[s] = true
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
		lock != NOBODY &&
		(UT || (ALL_SWEPT && NONE_SCHEDULING)) ->    /* SweepBeforeExpiry, AcquiringBeforeExpiry */
		if
		:: refreshed -> refreshed = false
		:: else -> lock = NOBODY
		fi;
		/* a new TTL period starts */
		for (i : 0 .. N-1) { hb_attempted[i] = false; swept[i] = false };
		i = 0
	   }
	od
}

init {
	atomic {
		byte k;
		for (k : 0 .. N-1) {
			run Creation(k); run Sandbox(k); run Heartbeat(k)
		};
		run Sweep(); run Expiry()
	}
}

/* ---- properties ---- */

/* MutualExclusion: a sandbox in its critical section holds the name. */
ltl MutualExclusion { [] ((!critical[0] || HOLDS(0)) && (!critical[1] || HOLDS(1))) }

/* Liveness: a sandbox holding the name outside its critical section eventually enters it
 * or loses the name. */
ltl Liveness {
	[] ((!critical[0] && HOLDS(0)) -> <> (critical[0] || !HOLDS(0))) &&
	[] ((!critical[1] && HOLDS(1)) -> <> (critical[1] || !HOLDS(1)))
}

/* EventualMutualExclusion: a critical sandbox that does not hold the name eventually leaves
 * its critical section for good. */
ltl EventualMutualExclusion {
	[] ((critical[0] && !HOLDS(0)) -> <> [] !critical[0]) &&
	[] ((critical[1] && !HOLDS(1)) -> <> [] !critical[1])
}
