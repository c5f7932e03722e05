/*
 * leasehold, model 2: the preemptible lock (DESIGN.md "Lock states": Acquiring, Commit,
 * Preempt, Revoke; "The supervisor": kill-switch synchronisation).
 *
 * Instead of a lease per sandbox, lockd keeps one liveness record per worker, and a failure
 * detector preempts a held name on demand (a competing acquire) when its worker's liveness
 * lapsed, or when the live worker answers IsRunning with "not running".
 *
 * The message order is the code's (supervisor/supervisor.cpp):
 *   scheduler -> lockd   Acquire(two_phase)          lockd: Free -> Acquiring{s} (epoch +1)
 *   lockd -> scheduler   Acquiring(epoch)
 *   scheduler -> worker  place s (run --name / expect_commit)
 *   worker               spawn s; the epoch is NOT published in shm, so s cannot pass its
 *                        check yet; then send Commit as its own message
 *   lockd                Commit: Acquiring{s} -> Held{s, worker} if the Acquiring deadline has
 *                        not passed (refused otherwise: the worker kills its copy)
 *   worker               on the Held answer: publish the epoch (only if the kill-switch is not
 *                        engaged); from then on s may enter its critical section
 * IsRunning(s, epoch) answers "running" for a spawned sandbox whose commit is pending, and its
 * answer may cross a commit (or anything else) in flight.  A scheduler may retry s onto another
 * worker under the same grant (the acquire is idempotent while s's grant is Acquiring or Held);
 * lockd commits at most one copy (a commit from a second worker is refused) and the supervisor
 * kills a copy whose commit was refused or not answered.
 * Worker heartbeats carry the worker's published names; the answer lists those no longer held
 * by it on this worker, and the supervisor kills their sandboxes (mutex violation recovery).
 * Revoke frees the name at epoch + 1 but keeps it ungrantable (lock-delay) until the worker
 * confirmed the kill (KillConfirmed, or a Release of the revoked grant after its kill-switch
 * killed it; the code sends either as its own message once the sandbox is dead, the model with
 * the worker's next heartbeat) or lockd's fixed bound (revoke time + liveness TTL + lock-delay)
 * passed, which does not move while the worker beats; the revocation is pushed to the worker
 * and also reaches it as a listed name in its next heartbeat answer.
 * A worker may crash (its sandboxes die with it, its liveness lapses).
 *
 * Timing relations, each a guard on a ghost history variable (never an implementation flag,
 * so a bug in how the implementation keeps its flags cannot weaken the assumption), each
 * disjoined with -DUNRELIABLE_TIMING:
 *   KillSwitchBeforeLapse   lockd lets w's liveness lapse only after w's kill-switch fired
 *                           since the last beat acknowledged after the firing
 *                           (g_fired[w]), or after w crashed (g_crashed[w])
 *                           (kill_after + margins < liveness TTL)
 *   KillOrFireBeforeBound   a revoke's bound passes only after the revocation reached w
 *                           since the revoke (the push arrived, or a beat answer arrived,
 *                           which lists the name), or w's kill-switch fired since the revoke,
 *                           or w crashed (g_rv_reached): within the liveness TTL after the
 *                           revoke, w either hears an answer sent after it or goes without
 *                           acknowledged beats for its TTL (< liveness TTL)
 * Nothing else here depends on time: an Acquiring name may expire at any moment, because a
 * copy becomes critical only after lockd answered its commit with Held.
 * -DUNRELIABLE_NETWORKS: any message may be lost (a request, or its answer after it took
 * effect).
 *
 * Switches (specs/README.md "Switches"):
 *   -DCOMMIT_BEFORE_SPAWN   the old order: Commit sent right after the Acquiring answer, spawn
 *                           (and publish) on the Held answer, IsRunning "not running" while
 *                           the supervisor is still acquiring
 *   -DNO_TWO_PHASE          acquire goes straight to Held{s, target worker}
 *   -DKILLSWITCH_SPARES_PENDING  the kill-switch kills only published copies, not a spawned
 *                           one whose commit is pending (its answer, if it arrives after a
 *                           beat sent after the firing cleared the kill-switch, publishes a
 *                           grant lockd may have revoked or preempted meanwhile)
 *   -DRELEASE_IGNORES_WORKER  a release by sandbox and epoch frees a Held record whatever worker
 *                           sends it (LeaseTable::release without LockService::authorize,
 *                           which refuses a worker's release of a name Held on another worker): a copy whose commit was
 *                           refused gives back the name its retried copy holds
 *   -DNO_WORKER_RECOVERY    a heartbeat answer's list of lost names kills nothing
 *   -DREVOKE_FREES_AT_ONCE  revoke makes the name grantable at once (no lock-delay)
 *   -DONE_WAY_LOSS          from the revoke on, every datagram lockd sends to the revoked
 *                           holder's worker is lost (beat answers, the push), for ever; that
 *                           worker's requests all arrive
 *   -DREVOKE_BOUND_FOLLOWS_LIVENESS  the old code: a revoke's lock-delay ends only with a kill
 *                           confirmation or the worker's liveness lapse (which its beats keep
 *                           moving), and a Release after a kill-switch kill confirms nothing
 *   -DNO_REVOKE_BOUND       ablation: a revoke's fixed bound never passes; only a kill
 *                           confirmation ends its lock-delay (shows that one does)
 *
 * Mutable guards and effects carry markers for specs/mutate: G = guard, E = effect.
 */

#define N 2            /* logical sandboxes */
#define W 2            /* workers */
#define I 3            /* copies: 0 = s0 on w0, 1 = s0 retried on w1, 2 = s1 on w1 */
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
#ifdef ONE_WAY_LOSS
#define ONEWAY(w) (g_revoked && (w) == rv_w)
#else
#define ONEWAY(w) 0
#endif

/* lock states */
#define FREE      0
#define ACQUIRING 1
#define HELD      2

/* a copy's life */
#define C_IDLE      0   /* not placed */
#define C_PLACED    1   /* the scheduler told its worker to run it */
#define C_SPAWNED   2   /* spawned, epoch not published, commit pending */
#define C_COMMITTING 3  /* COMMIT_BEFORE_SPAWN: commit sent, not spawned */
#define C_CRIT      4   /* epoch published: may be in its critical section */
#define C_DEAD      5   /* exited, killed, refused, or never started */

byte lock_state = FREE;
byte lock_owner = NOBODY;
byte lock_worker = NOBODY;    /* Held only */
bool rv_pending;              /* lockd: revoked, lock-delay until kill confirmed or lapse */
byte rv_s = NOBODY;           /* the revoked holder and its worker */
byte rv_w = NOBODY;

byte copy[I];
bool wants[N];                /* the scheduler of s has not got its grant yet */

bool live[W];                 /* lockd: w's liveness has not lapsed */
bool live_refreshed[W];       /* lockd: a beat arrived since the last liveness tick */
bool hb_failed[W];            /* worker: its latest beat failed */
bool hb_was_lost[W];          /* the previous beat was lost */
bool tripped[W];              /* worker: kill-switch engaged (killswitch_engaged) */
bool crashed[W];
byte hb_names[W];             /* bit s: the beat in flight lists s's name (published) */
byte hb_lost[W];              /* bit s: the answer lists s's name as no longer held here */
byte conf[W];                 /* bit s: worker killed s after a revocation; to confirm */
byte hb_conf[W];              /* the confirmations the beat in flight carries */
bool hb_after_trip[W];        /* the beat in flight was sent while the kill-switch was engaged */

/* IsRunning: one outstanding question per name (LockService::asked_) */
byte q_stage;                 /* 0 none, 1 question in flight, 2 answer in flight */
byte q_s = NOBODY;
byte q_w = NOBODY;
bool q_running;
bool q_lost;                  /* the previous question was lost */

/* ghosts: history, not implementation state */
bool g_fired[W];              /* w's kill-switch fired; cleared only by the acknowledgement
                                 of a beat sent after the firing */
bool g_hb_after_fire[W];      /* the beat in flight was sent after g_fired was set */
bool g_crashed[W];
bool g_revoked;               /* a revoke took the name from a holder */
bool g_preempted;             /* the failure detector took the name from a holder */
bool g_handover;              /* a copy became critical after a revoke or preemption */
bool g_rv_reached;            /* since the revoke: it reached rv_w, rv_w fired or crashed */
bool g_beat_lost[W];          /* w's latest beat went unacknowledged (request or answer lost) */
bool g_fired_unprompted;      /* a kill-switch fired while its worker's latest beat was acknowledged */

#define S_OF(i)       ((i) == 2 -> 1 : 0)
#define W_OF(i)       ((i) == 0 -> 0 : 1)
#define CRIT(i)       (copy[i] == C_CRIT)
#define ALIVE(i)      (copy[i] == C_SPAWNED || copy[i] == C_COMMITTING || copy[i] == C_CRIT)
#define HOLDS(s)      (lock_state != FREE && lock_owner == (s))
#define HELD_BY(s, w) (lock_state == HELD && lock_owner == (s) && lock_worker == (w))
/* the name cannot go to anyone else: held by s on w, or revoked from s on w and the kill
 * not yet confirmed */
#define COVERED(s, w) (HELD_BY(s, w) || (rv_pending && rv_s == (s) && rv_w == (w)))
#define ON(i, w)      (copy[i] != C_IDLE && W_OF(i) == (w))
#ifdef COMMIT_BEFORE_SPAWN
#define RUNNING(i)    (copy[i] == C_CRIT)    /* an acquiring sandbox is "not running" */
#else
#define RUNNING(i)    (copy[i] == C_SPAWNED || copy[i] == C_CRIT)
#endif
#define RUNNING_ON(s, w) ((S_OF(0) == (s) && ON(0, w) && RUNNING(0)) || \
                          (S_OF(1) == (s) && ON(1, w) && RUNNING(1)) || \
                          (S_OF(2) == (s) && ON(2, w) && RUNNING(2)))
/* a worker heartbeats while it has a published copy, has to recover, has confirmations to
 * send or a revocation to learn (other beats only refresh a liveness that nothing lets
 * lapse; a worker beats regardless in the code) */
#define ACTIVE(w)     ((CRIT(0) && W_OF(0) == (w)) || (CRIT(1) && W_OF(1) == (w)) || \
                       (CRIT(2) && W_OF(2) == (w)) || tripped[w] || !live[w] || conf[w] != 0 || \
                       (rv_pending && rv_w == (w)))
#define BIT(s)        (1 << (s))
/* a release (exit, or commit_failed giving the name back) by (name, sandbox, epoch) frees an Acquiring record
 * of s, and a Held one only if it is held on this worker (a Held record on another worker is
 * a retried copy's commit, not ours) */
#ifdef RELEASE_IGNORES_WORKER
#define RELEASES(s, w) HOLDS(s)
#else
#define RELEASES(s, w) (lock_owner == (s) && (lock_state == ACQUIRING || HELD_BY(s, w)))
#endif

inline kill(i)
{
	if
	:: ALIVE(i) -> copy[i] = C_DEAD
	:: else
	fi
}

/* lockd frees the name (release, preempt, revoke) */
inline to_free()
{
	lock_state = FREE; lock_owner = NOBODY; lock_worker = NOBODY
}

/* ---- Scheduler(s): acquire (2-phase), then place; sandbox 0 may be retried on w1 ---- */
proctype Scheduler(byte s)
{
	byte first;
	if
	:: s == 0 -> first = 0
	:: s == 1 -> first = 2
	fi;
	do
	:: atomic { s == 0 && lock_state != FREE -> wants[s] = false; goto finish }  /* s0 tries once */
	:: atomic {    /* LeaseTable::acquire_2pc (LockService::on_acquire) */
		/*@G acquire_free*/ lock_state == FREE && !rv_pending ->
		lock_owner = s;
#ifdef NO_TWO_PHASE
		lock_state = HELD; lock_worker = W_OF(first);
#else
		/*@E acquire_acquiring*/ lock_state = ACQUIRING;
#endif
		wants[s] = false;
		/*@E place*/ copy[first] = C_PLACED;
		break
	   }
	:: atomic {    /* refused "held": LockService::try_preempt */
		/*@G acquire_held*/ s == 1 && lock_state == HELD && lock_owner != s &&
		(!live[lock_worker] || q_stage == 0) ->
		if
		:: /*@G preempt_lapsed*/ !live[lock_worker] ->
			/* liveness lapsed: LeaseTable::preempt, then the same request acquires */
			to_free(); g_preempted = true
		:: else ->   /* ask the live worker: LockService::ask_is_running */
			/*@E ask*/ q_stage = 1; q_s = lock_owner; q_w = lock_worker
		fi
	   }
	od;
#if !defined(NO_TWO_PHASE) && !UN && !UT
	/* (only with reliable networks and timing: the retry's race does not need either to be
	 * unreliable, and together they exceed the state-space budget) */
	if
	:: s == 0 ->
		if
		:: atomic {  /* retry onto w1: the acquire is idempotent for s0's grant */
			/*@G retry*/ lock_state != FREE && lock_owner == 0 -> copy[1] = C_PLACED
		   }
		:: true
		fi
	:: else
	fi;
#endif
finish:	first = 0
}

/* ---- Copy(i): one placement of a sandbox on its worker, and the sandbox itself ---- */
proctype Copy(byte i)
{
	bool ok;
	byte w;
	copy[i] == C_PLACED;
	w = W_OF(i);
	/* supervisor gate_named_creation: refused while the kill-switch is engaged */
	atomic {
		if
		:: /*@G spawn_gate*/ tripped[w] || crashed[w] -> copy[i] = C_DEAD
#if defined(COMMIT_BEFORE_SPAWN)
		:: else -> copy[i] = C_COMMITTING          /* Commit at once, no spawn */
#else
		:: else -> /*@E spawn*/ copy[i] = C_SPAWNED   /* spawn, unpublished; Commit sent */
#endif
		fi
	};
	if
	:: copy[i] == C_DEAD -> goto done
	:: else
	fi;
#ifndef NO_TWO_PHASE
	/* lockd: Commit (LockService::on_commit, LeaseTable::commit) */
	atomic {
		if
		:: /*@G commit_ok*/ lock_state == ACQUIRING && lock_owner == S_OF(i) ->
			/*@E commit*/ lock_state = HELD; lock_worker = w; ok = true;
			/*@E commit_live*/ live[w] = true; live_refreshed[w] = true   /* a liveness beat of w */
		:: /*@G commit_idem*/ HELD_BY(S_OF(i), w) -> ok = true   /* idempotent retry */
		:: else -> ok = false    /* not_acquiring / stale_epoch / acquiring_expired */
		fi;
		if
		:: UN -> ok = false      /* request or answer lost: the call times out */
		:: true
		fi
	};
#else
	ok = true;
#endif
	/* the answer at the worker (supervisor on_granted): publish, or kill the copy */
	atomic {
		if
		:: /*@G answer_alive*/ copy[i] == C_SPAWNED || copy[i] == C_COMMITTING ->
			if
			:: /*@G publish_gate*/ ok ->
				/*@E publish*/ copy[i] = C_CRIT;
				g_handover = g_handover || g_revoked || g_preempted
			:: else ->   /* commit_failed: kill the copy, release (Acquiring abort, or a lost answer) */
				copy[i] = C_DEAD;
				if
				:: /*@G giveback_release*/ RELEASES(S_OF(i), w) -> to_free()
				:: else
				fi
			fi
		:: else
		fi
	};
	if
	:: copy[i] != C_CRIT -> goto done
	:: else
	fi;
	/* the sandbox: not fair (see model 1) */
	if
	:: true ->
end_forever:	copy[i] == C_DEAD       /* never releases; only a kill ends it */
	:: true ->
end_critical:	atomic {   /* exit -> release_to_lockd -> LeaseTable::release */
			/*@G release*/ copy[i] == C_CRIT -> copy[i] = C_DEAD;
			if
			:: UN -> skip        /* the release is lost: the name stays Held until preempted */
			:: /*@G release_held*/ RELEASES(S_OF(i), w) -> to_free()
			:: else
			fi
		}
	fi;
done:	ok = false; w = 0
}

/* ---- Question: IsRunning, one at a time; the answer crosses whatever is in flight ---- */
proctype Question()
{
end_idle:
	do
	:: atomic {    /* at the worker: supervisor is_running */
		q_stage == 1 ->
		if
		:: /*@G q_worker_up*/ !crashed[q_w] -> /*@E q_answer*/ q_running = RUNNING_ON(q_s, q_w); q_stage = 2
		:: else -> q_stage = 0; q_s = NOBODY; q_w = NOBODY  /* no answer: lockd times out */
		fi;
		if   /* lost; a retried question is not lost for ever (no two losses in a row) */
		:: UN && !q_lost -> q_lost = true; q_stage = 0; q_s = NOBODY; q_w = NOBODY; q_running = false
		:: true -> q_lost = false
		fi
	   }
	:: atomic {    /* at lockd: LockService::on_running_answer -> LeaseTable::preempt */
		q_stage == 2 ->
		if
		:: /*@G q_preempt*/ !q_running && HELD_BY(q_s, q_w) -> to_free(); g_preempted = true
		:: else
		fi;
		q_stage = 0; q_s = NOBODY; q_w = NOBODY; q_running = false
	   }
	od
}

/* ---- Heartbeat(w): the worker-liveness beat ----
 * One step: request and answer cannot be in flight across other events (the crossing of a
 * beat and the kill-switch is covered by the "sent after the kill-switch" rule below, which
 * is trivially met by an atomic beat; see specs/README.md "Not modelled"). */
/* send: supervisor send_worker_beat, carrying the published names and confirmations */
inline hb_send(w)
{
	hb_names[w] = 0;
	for (k : 0 .. I-1) {
		if
		:: CRIT(k) && W_OF(k) == w -> hb_names[w] = hb_names[w] | BIT(S_OF(k))
		:: else
		fi
	};
	/*@E beat_conf*/ hb_conf[w] = conf[w];
	/*@E beat_after_trip*/ hb_after_trip[w] = tripped[w];
	g_hb_after_fire[w] = g_fired[w]
}

/* lockd: LeaseTable::worker_heartbeat; the answer lists the names no longer held here */
inline hb_deliver(w)
{
	/*@E lockd_live*/ live[w] = true;
	/*@E lockd_refreshed*/ live_refreshed[w] = true;
	hb_lost[w] = 0;
	for (k : 0 .. N-1) {
		if
		:: /*@G lockd_lost*/ (hb_names[w] & BIT(k)) && !HELD_BY(k, w) ->
			hb_lost[w] = hb_lost[w] | BIT(k)
		:: /*@G lockd_revoked*/ rv_pending && rv_s == k && rv_w == w ->
			hb_lost[w] = hb_lost[w] | BIT(k)     /* the revocation, again */
		:: else
		fi;
		if
		:: /*@G lockd_confirm*/ (hb_conf[w] & BIT(k)) && rv_pending && rv_s == k && rv_w == w ->
			/*@E confirm_clears*/ rv_pending = false
		:: else
		fi
	}
}

/* the answer at the worker: on_worker_liveness_ack, then recovery */
inline hb_answer(w)
{
	/*@E ack_ok*/ hb_failed[w] = false;
	conf[w] = conf[w] & ~hb_conf[w];
	if
	:: /*@G ack_clears_trip*/ hb_after_trip[w] -> /*@E untrip*/ tripped[w] = false
	:: else
	fi;
	if
	:: g_hb_after_fire[w] -> g_fired[w] = false
	:: else
	fi;
#ifndef NO_WORKER_RECOVERY
	/* mutex violation recovery: kill the sandboxes of the listed names */
	for (k : 0 .. I-1) {
		if
		:: /*@G recovery*/ W_OF(k) == w && (hb_lost[w] & BIT(S_OF(k))) && ALIVE(k) ->
			/*@E recovery_kill*/ copy[k] = C_DEAD
		:: else
		fi
	};
	/* every listed name is confirmed on the next beat (killed, or not here) */
	conf[w] = conf[w] | hb_lost[w];
#endif
	if :: rv_pending && rv_w == w -> g_rv_reached = true :: else fi
}

inline hb_clear(w)
{
	hb_lost[w] = 0; hb_names[w] = 0; hb_conf[w] = 0; hb_after_trip[w] = false;
	g_hb_after_fire[w] = false; k = 0
}

proctype Heartbeat(byte w)
{
	byte k;
end_idle:
	do
	:: atomic {
		!crashed[w] && ACTIVE(w) ->
		hb_send(w);
		if   /* a beat is not lost for ever: no two losses in a row (but ONE_WAY_LOSS) */
		:: ONEWAY(w) -> hb_deliver(w); hb_failed[w] = true; g_beat_lost[w] = true  /* the answer is lost */
		:: !ONEWAY(w) ->                                 /* delivered, answered */
			hb_deliver(w); hb_answer(w); hb_was_lost[w] = false; g_beat_lost[w] = false
		:: UN && !hb_was_lost[w] ->                      /* request lost */
			hb_failed[w] = true; hb_was_lost[w] = true; g_beat_lost[w] = true
		:: UN && !hb_was_lost[w] ->                      /* answer lost after lockd applied it */
			hb_deliver(w); hb_failed[w] = true; hb_was_lost[w] = true; g_beat_lost[w] = true
		fi;
		hb_clear(w)
	   }
	od
}

/* ---- KillSwitch(w): worker-wide, once per outage (check_worker_liveness) ---- */
proctype KillSwitch(byte w)
{
	byte k;
end_idle:
	do
	:: atomic {
		/*@G killswitch*/ hb_failed[w] && !tripped[w] && !crashed[w] ->
		/* every sandbox on w, a spawned one whose commit is pending included: a commit
		 * answered after the kill-switch engaged may be for a name lockd has since let go */
		for (k : 0 .. I-1) {
			if
#ifdef KILLSWITCH_SPARES_PENDING
			:: W_OF(k) == w && CRIT(k) -> copy[k] = C_DEAD
#else
			:: W_OF(k) == w -> /*@E killswitch_kill*/ kill(k)
#endif
			:: else
			fi
		};
		/*@E trip*/ tripped[w] = true;
		g_fired[w] = true;
		g_fired_unprompted = g_fired_unprompted || !g_beat_lost[w];
		if   /* the revoked copy was killed: its Release confirms it (LockService::on_release) */
#ifndef REVOKE_BOUND_FOLLOWS_LIVENESS
		:: rv_pending && rv_w == w -> /*@E killswitch_conf*/ conf[w] = conf[w] | BIT(rv_s); g_rv_reached = true
#endif
		:: else
		fi;
		k = 0
	   }
	od
}

/* ---- LivenessTimer(w): lockd's per-worker liveness TTL (LeaseTable::advance, worker_alive) ---- */
/* A liveness period ends: it consumes the beat received in it, or the liveness lapses.  The
 * timer ticks only while a lapse is allowed (a tick before that only clears the flag, which
 * the first tick after it does as well). */
proctype LivenessTimer(byte w)
{
end_idle:
	do
	:: atomic {
		live[w] && /*@G lapse*/ (g_fired[w] || g_crashed[w] || UT) ->    /* KillSwitchBeforeLapse */
		if
		:: live_refreshed[w] -> live_refreshed[w] = false
		:: else ->
			/*@E lapse_live*/ live[w] = false;  /* a revoke's bound is its own (rv_bound) */
#ifdef REVOKE_BOUND_FOLLOWS_LIVENESS
			if :: rv_pending && rv_w == w -> rv_pending = false :: else fi
#endif
			skip
		fi
	   }
	od
}

/* ---- AcquiringTimer: the Acquiring TTL (LeaseTable::advance); safe at any time ---- */
proctype AcquiringTimer()
{
end_idle:
	do
	:: atomic { /*@G acquiring_expiry*/ lock_state == ACQUIRING -> to_free() }
	od
}

/* ---- Operator: one revoke (with its push) or one worker crash ---- */
proctype Operator()
{
	byte k;
	bool push;
	bool done;      /* one revoke or one crash per run: each alone shows its effect */
end_idle:
	do
	:: atomic {    /* leasehold revoke: LockService::on_revoke, LeaseTable::revoke */
		!done && lock_state == HELD ->
		done = true;
#ifndef REVOKE_FREES_AT_ONCE
		/*@E revoke_delay*/ rv_pending = true;
#endif
		rv_s = lock_owner; rv_w = lock_worker;
		g_rv_reached = g_fired[rv_w];   /* fired, no beat acknowledged since: all its copies died */
		to_free();
		g_revoked = true;
		/*@E push*/ push = true
	   }
	:: atomic {    /* revoke of an Acquiring name: no copy can be published under it */
		!done && lock_state == ACQUIRING -> done = true; to_free()
	   }
	:: atomic {    /* the pushed revocation reaches the worker: kill, confirm on next beat */
		push ->
		push = false;
		if
		:: UN -> skip                                       /* lost */
		:: /*@G push_arrives*/ !crashed[rv_w] && !ONEWAY(rv_w) ->
			for (k : 0 .. I-1) {
				if
				:: W_OF(k) == rv_w && S_OF(k) == rv_s -> /*@E push_kill*/ kill(k)
				:: else
				fi
			};
			/*@E push_conf*/ conf[rv_w] = conf[rv_w] | BIT(rv_s);
			g_rv_reached = true
		:: else
		fi;
		k = 0
	   }
#if !defined(REVOKE_BOUND_FOLLOWS_LIVENESS) && !defined(NO_REVOKE_BOUND)
	:: atomic {    /* the revoke's fixed bound passes (LeaseTable::advance, revoke_bound) */
		/*@G rv_bound*/ rv_pending && (g_rv_reached || UT) -> /*@E rv_bound_ends*/ rv_pending = false
	   }
#endif
	:: atomic {    /* a worker crashes: its sandboxes die with it, it stops */
		!done -> done = true;
		select(k : 0 .. W-1);
		crashed[k] = true; g_crashed[k] = true;
		if :: rv_pending && rv_w == k -> g_rv_reached = true :: else fi;
		if :: W_OF(0) == k -> kill(0) :: else fi;
		if :: W_OF(1) == k -> kill(1) :: else fi;
		if :: W_OF(2) == k -> kill(2) :: else fi;
		k = 0
	   }
	od
}

init {
	atomic {
		byte i;
		for (i : 0 .. W-1) { live[i] = true };
		for (i : 0 .. N-1) { wants[i] = true; run Scheduler(i) };
		for (i : 0 .. I-1) { run Copy(i) };
		for (i : 0 .. W-1) { run Heartbeat(i); run KillSwitch(i); run LivenessTimer(i) };
		run Question(); run AcquiringTimer(); run Operator()
	}
}

/* ---- properties ---- */

/* MutualExclusion: a copy that may be in its critical section is covered by the name: held
 * by its sandbox on its worker, or revoked from it and the kill not yet confirmed. */
ltl MutualExclusion {
	[] ((!CRIT(0) || COVERED(0, 0)) && (!CRIT(1) || COVERED(0, 1)) && (!CRIT(2) || COVERED(1, 1)))
}

/* Liveness (on demand, as the failure detector works): while the other scheduler still
 * wants the name, a name held by s with no critical copy is eventually used or freed. */
ltl Liveness {
	[] ((HOLDS(0) && !CRIT(0) && !CRIT(1) && wants[1]) -> <> (CRIT(0) || CRIT(1) || !HOLDS(0) || !wants[1])) &&
	[] ((HOLDS(1) && !CRIT(2) && wants[0]) -> <> (CRIT(2) || !HOLDS(1) || !wants[0]))
}

/* EventualMutualExclusion: a critical copy whose name is not held by it on its worker
 * (revoked, preempted, or never its own) eventually leaves its critical section for good. */
ltl EventualMutualExclusion {
	[] ((CRIT(0) && !HELD_BY(0, 0)) -> <> [] !CRIT(0)) &&
	[] ((CRIT(1) && !HELD_BY(0, 1)) -> <> [] !CRIT(1)) &&
	[] ((CRIT(2) && !HELD_BY(1, 1)) -> <> [] !CRIT(2))
}

/* RevokeEnds: the lock-delay of a revoke ends (kill confirmed, or its bound passed), so a
 * revoked name does not stay ungrantable, also while lockd's answers to the worker are lost. */
ltl RevokeEnds { [] (rv_pending -> <> !rv_pending) }

/* KillSwitchOnlyAfterLoss: a worker's kill-switch fires only while its latest beat went
 * unacknowledged (a beat interval < kill_after): a worker whose beats are answered keeps its
 * sandboxes.  Checked with reliable timing only: a supervisor paused past its budget sends no
 * beat and then fires with its latest beat acknowledged. */
ltl KillSwitchOnlyAfterLoss { [] !g_fired_unprompted }

/* Non-vacuity (expected to FAIL): a copy does reach its critical section, one does after
 * the name was revoked or preempted from another holder, a retried copy does, and a revoke's
 * lock-delay does end. */
ltl NeverCritical { [] !(CRIT(0) || CRIT(1) || CRIT(2)) }
ltl NeverHandedOver { [] !g_handover }
ltl NeverRetriedCritical { [] !CRIT(1) }
/* With NO_REVOKE_BOUND only a kill confirmation ends it: NeverRevokeEnds then fails by the
 * confirmation of the pushed revocation's kill, and with ONE_WAY_LOSS as well (the worker hears
 * nothing from lockd) by the Release of the grant its kill-switch killed. */
ltl NeverRevokeEnds { [] (!g_revoked || rv_pending) }
