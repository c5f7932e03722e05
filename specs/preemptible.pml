/*
 * leasehold, model 2: the preemptible lock (DESIGN.md "Lock states": Acquiring, Commit,
 * Preempt; "The supervisor": kill-switch synchronisation).
 *
 * Instead of a lease per sandbox, lockd keeps one liveness record per worker and a failure
 * detector preempts a held name when its worker's liveness lapsed, or when the live worker
 * says the sandbox is not running.  That is only safe with three mechanisms, each of which
 * has an ablation here:
 *   2-phase acquire   the name is Acquiring (owner, no worker, NOT preemptible) until the
 *                     worker's heartbeat commits it, carrying the worker; an Acquiring name
 *                     expires on its own TTL.                      ablation: -DNO_TWO_PHASE
 *   kill-switch       a worker whose heartbeats fail kills every sandbox on it, once per
 *                     outage, before lockd's view of its liveness lapses.
 *   synchronisation   after the kill-switch the worker refuses named creation until a
 *                     heartbeat succeeds, and the check and the spawn are one step with
 *                     respect to the kill-switch.               ablation: -DNO_KILLSWITCH_SYNC
 *
 * Processes: Creation(s), Sandbox(s) (not fair, as in model 1), Heartbeat(w),
 * KillSwitch(w), LivenessTimer (lockd's per-worker liveness TTL), AcquiringTimer (the
 * Acquiring TTL and the failure detector's preemption of a Held name).
 *
 * Timing relations (each disjoined with -DUNRELIABLE_TIMING):
 *   KillSwitchBeforeLapse      lockd lets a worker's liveness lapse only after that worker's
 *                              kill-switch fired (kill_after + margins < liveness TTL; an
 *                              answer lost on the way back only makes the kill earlier)
 *   AcquiringBeforeExpiry      an Acquiring name does not expire while its sandbox is still
 *                              being placed, nor while it runs uncommitted on a worker whose
 *                              kill-switch has not fired (acquiring TTL > scheduling latency
 *                              + kill_after)
 * -DUNRELIABLE_NETWORKS: a heartbeat may lose its request or its answer.
 */

#define N 2            /* sandboxes; BOUND/ACTIVE and the ltl formulas are written out for two */
#define W 2            /* workers; LivenessTimer is written out for two */
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

/* lock states */
#define FREE      0
#define ACQUIRING 1
#define HELD      2

/* sandbox life cycle */
#define INIT       0
#define SCHEDULING 1   /* name acquired, sandbox being placed on target[s] */
#define RUNNING    2
#define DONE       3


byte lock_state = FREE;
byte lock_owner = NOBODY;
byte lock_worker = NOBODY;   /* Held only: the worker the commit came from */

byte proc[N];
bool critical[N];
byte target[N];              /* worker chosen by the scheduler */

bool live[W];                /* lockd: the worker's liveness has not lapsed */
bool live_refreshed[W];      /* lockd: a heartbeat arrived since the last liveness tick */
bool hb_failed[W];           /* worker: its latest heartbeat failed */
bool tripped[W];             /* worker: kill-switch fired, no heartbeat succeeded since */

#define HOLDS(s)     (lock_state != FREE && lock_owner == (s))
#define ON(s, w)     (proc[s] == RUNNING && target[s] == (w))
#define BOUND(s, w)  ((proc[s] == SCHEDULING || proc[s] == RUNNING) && target[s] == (w))
/* A worker heartbeats while it has (or is about to get) a sandbox, or has to recover.
 * Leaving out an idle healthy worker's heartbeats loses only kill-switch firings that
 * happen before any sandbox is bound to it; the same firing after the binding and before
 * the worker's check is still explored, and it has the same effect (a refused placement). */
#define ACTIVE(w)    (BOUND(0, w) || BOUND(1, w) || tripped[w] || !live[w])

/* ---- Creation: acquire (2-phase), then place on a worker ---- */
proctype Creation(byte s)
{
	byte w;
#ifdef NO_KILLSWITCH_SYNC
	bool admitted;
#endif
	/* the scheduler picks a worker; workers start alike, so by symmetry sandbox 0 may be
	 * taken to land on worker 0 and only sandbox 1 needs both choices */
	if :: w = 0 :: s == 1 -> w = 1 fi;
	atomic {
		if
		:: lock_state == FREE ->
			lock_owner = s; proc[s] = SCHEDULING; target[s] = w;
#ifdef NO_TWO_PHASE
			lock_state = HELD; lock_worker = w    /* LeaseTable::acquire (lease mode) */
#else
			lock_state = ACQUIRING                /* LeaseTable::acquire_2pc */
#endif
		:: else -> proc[s] = DONE; goto done      /* refused: never started */
		fi
	};
#ifdef NO_KILLSWITCH_SYNC
	/* the worker checks its kill-switch, then spawns: two steps */
	atomic { admitted = !tripped[w] };
	atomic {
		if
		:: admitted -> proc[s] = RUNNING; critical[s] = true
		:: else -> proc[s] = DONE
		fi;
		admitted = false
	};
#else
	/* check and spawn under the same lock as the kill-switch */
	atomic {
		if
		:: !tripped[w] -> proc[s] = RUNNING; critical[s] = true
		:: else -> proc[s] = DONE             /* refused until a heartbeat succeeds */
		fi
	};
#endif
done:	w = 0
}

/* ---- Sandbox: not fair (see model 1) ---- */
proctype Sandbox(byte s)
{
	if
	:: true ->
end_forever:	false
	:: true
	fi;
end_critical:
	atomic {
		critical[s] -> critical[s] = false;
		if
		:: HOLDS(s) -> lock_state = FREE; lock_owner = NOBODY; lock_worker = NOBODY
		:: else
		fi
	};
	proc[s] = DONE
}

/* lockd's side of a delivered heartbeat from w: liveness, and commits
 * (LeaseTable::worker_heartbeat, LeaseTable::commit) */
inline lockd_receives(w)
{
	live[w] = true; live_refreshed[w] = true;
	for (k : 0 .. N-1) {
		if
		:: ON(k, w) && lock_state == ACQUIRING && lock_owner == k ->
			lock_state = HELD; lock_worker = w
		:: else
		fi
	}
}

/* ---- Heartbeat: one per worker, batched over its sandboxes ---- */
proctype Heartbeat(byte w)
{
	byte k;
end_idle:
	do
	:: atomic {
		ACTIVE(w) ->
		if
		:: true ->                             /* delivered and answered */
			lockd_receives(w);
			hb_failed[w] = false; tripped[w] = false;
			/* mutex violation recovery: a sandbox whose name is not its own dies */
			for (k : 0 .. N-1) {
				if
				:: ON(k, w) && !HOLDS(k) -> critical[k] = false; proc[k] = DONE
				:: else
				fi
			}
		:: UN -> hb_failed[w] = true           /* request lost */
		:: UN -> lockd_receives(w); hb_failed[w] = true   /* answer lost */
		fi;
		k = 0
	   }
	od
}

/* ---- KillSwitch: one per worker, worker-wide, once per outage ---- */
proctype KillSwitch(byte w)
{
	byte k;
end_idle:
	do
	:: atomic {
		hb_failed[w] && !tripped[w] ->
		for (k : 0 .. N-1) {
			if
			:: ON(k, w) -> critical[k] = false; proc[k] = DONE
			:: else
			fi
		};
		tripped[w] = true;
		k = 0
	   }
	od
}

/* ---- LivenessTimer: lockd's per-worker liveness TTL (LeaseTable::advance) ---- */
proctype LivenessTimer()
{
	/* Not needed for progress (a dead sandbox's name is preempted through its live
	 * worker), so no round-robin: any worker's period may end at any time. */
end_idle:
	do
	:: atomic { live_refreshed[0] -> live_refreshed[0] = false }
	:: atomic { live_refreshed[1] -> live_refreshed[1] = false }
	:: atomic { !live_refreshed[0] && live[0] && (tripped[0] || UT) -> live[0] = false }  /* KillSwitchBeforeLapse */
	:: atomic { !live_refreshed[1] && live[1] && (tripped[1] || UT) -> live[1] = false }
	od
}

/* ---- AcquiringTimer: Acquiring TTL (LeaseTable::advance) and preemption (LeaseTable::preempt) ---- */
proctype AcquiringTimer()
{
end_idle:
	do
	:: atomic {
		lock_state == ACQUIRING &&
		(UT || (proc[lock_owner] != SCHEDULING &&
		        (proc[lock_owner] != RUNNING || tripped[target[lock_owner]]))) ->  /* AcquiringBeforeExpiry */
		lock_state = FREE; lock_owner = NOBODY
	   }
	:: atomic {
		/* failure detector: liveness lapsed, or the live worker says the sandbox is not running */
		lock_state == HELD &&
		(!live[lock_worker] || !ON(lock_owner, lock_worker)) ->
		lock_state = FREE; lock_owner = NOBODY; lock_worker = NOBODY
	   }
	od
}

init {
	atomic {
		byte i;
		for (i : 0 .. W-1) { live[i] = true };
		for (i : 0 .. N-1) { target[i] = NOBODY; run Creation(i); run Sandbox(i) };
		for (i : 0 .. W-1) { run Heartbeat(i); run KillSwitch(i) };
		run LivenessTimer(); run AcquiringTimer()
	}
}

/* ---- properties (as in model 1; holding = Acquiring or Held by s) ---- */
ltl MutualExclusion { [] ((!critical[0] || HOLDS(0)) && (!critical[1] || HOLDS(1))) }

ltl Liveness {
	[] ((!critical[0] && HOLDS(0)) -> <> (critical[0] || !HOLDS(0))) &&
	[] ((!critical[1] && HOLDS(1)) -> <> (critical[1] || !HOLDS(1)))
}

ltl EventualMutualExclusion {
	[] ((critical[0] && !HOLDS(0)) -> <> [] !critical[0]) &&
	[] ((critical[1] && !HOLDS(1)) -> <> [] !critical[1])
}
