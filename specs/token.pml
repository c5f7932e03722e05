/*
 * leasehold, model 5: waiters served by token passing, with seizure and reconciliation
 * (DESIGN.md "lockd": waiters form a FIFO per name; the name passes to the head at a new
 * epoch, passed when the holder cooperates, seized when not; a supervisor reconciles every
 * belief with lockd before it recovers).
 *
 * Raymond's tree-based token passing over three nodes in a line, 0 - 1 - 2 (a star with
 * centre 1; lockd's FIFO of waiters is the star case).  Each node has `holder` (the
 * neighbour toward the privilege, itself when it believes it holds), a FIFO of requesters
 * (itself and nodes that sent it a REQUEST), `asked` (its own REQUEST is outstanding) and
 * `in_cs`.  The privilege is one value, `tok`: who really holds it (lockd's record).  A
 * node's belief (`holder[n] == n`) and possession (`tok == n`) are different things: a
 * seizure moves the privilege without the old holder taking part, and leaves it a stale
 * holder that still believes, perhaps inside its critical section.
 *
 * Ownership epochs: every grant of the privilege (a pass or a seizure) issues a token
 * {node, epoch} at a new epoch; issued tokens are never withdrawn (`issued[n]`, a bit set),
 * and a node may present any of its tokens at any time.  The resource's FenceGate admits a
 * write iff its epoch is at least the highest it has seen; every grant announces its new
 * epoch to the gate in the same step (a seizure burns and announces its epoch before the
 * privilege moves), so the gate never lags the grants.
 *
 * Transitions (each guarded on the liveness of the nodes it makes act, and on no other):
 *   Request(n)          n wants its critical section: n joins its own queue
 *   MAKE_REQUEST        run by n after each event at n (Raymond): n does not believe it
 *                       holds, has a queue and has not asked: REQUEST to holder[n], tagged
 *                       with gcnt[n], the number of grants n has received
 *   ReceiveRequest(n)   a REQUEST addressed to n arrives: the sender joins n's queue (once)
 *   PassToken(n)        Raymond's ASSIGN_PRIVILEGE to another node: n is live, believes it
 *                       holds, really holds (lockd hands over only the current grant), is not
 *                       in its critical section; the head of its queue is live (it records
 *                       the privilege) and gets it at a new epoch
 *   Discard(n)          the holder drops a head entry whose REQUEST predates that node's
 *                       latest grant: a seizure for it, or a grant while its REQUEST was
 *                       still queued elsewhere, answered it already (Suzuki-Kasami's test)
 *   EnterCS / ExitCS    ASSIGN_PRIVILEGE to itself, and the release: a live node that
 *                       believes it holds and owes no reconciliation
 *   Crash(n)            n stops taking part; its state stays as it was (a node that comes
 *                       back knows nothing of what happened meanwhile)
 *   Recover(n)          refused while n owes a reconciliation (n is in `seized`)
 *   Seize(from, to)     the coordinator, with no guard on `from`'s liveness: burn an epoch,
 *                       announce it, give the privilege to the waiter `to` (live); `from`'s
 *                       holder, queue and critical section are left as they are (it cannot
 *                       be reached), and `from` is marked seized
 *   Reconcile(n)        a seized node re-reads the truth: it leaves its critical section
 *                       (its sandbox is killed), aims holder at the true holder and clears
 *                       its mark.  It may fire while n is down (it is the boundary step of
 *                       coming back), and while n is live (a wrongly suspected node).
 *   A grant (pass or seizure) clears the recipient's mark: it now believes what is true.
 *   It also counts the grant and clears the recipient's `asked`: a REQUEST of it still
 *   queued anywhere is answered.  Without the tags, a REQUEST that a seizure answered stays
 *   queued upstream, and such orphans kept the privilege circulating for ever between two
 *   nodes that did not wait (or, with `asked` left set, deadlocked two REQUESTs queued at
 *   each other).
 *
 * The coordinator seizes from a holder it suspects: one that is down, one that hangs in its
 * critical section (live, never releasing, never passing), or, once per run, a healthy one
 * (a wrong suspicion: seizure needs no oracle).
 *
 * Bounds (state-space limits, not protocol limits): each node asks for its critical section
 * REQ_MAX times, one crash and one hang per run, one wrong suspicion; epochs up to EPOCH_MAX,
 * which no run reaches (an assertion in `issue` says so, so no verdict is an artefact of it).
 *
 * Ablations:
 *   -DRECOVER_WITHOUT_RECONCILE  a seized node may recover, and its recovery clears the mark
 *                                without repairing the belief (a restart that trusts memory)
 *   -DSEIZE_NEEDS_DEAD_VICTIM    the coordinator seizes only from a node that is down (an
 *                                oracle: the coordinator cannot know it)
 *   -DCRASHED_MAY_PASS           a node that is down may hand the privilege on
 *   -DGRANT_KEEPS_SEIZED_MARK    a grant leaves the recipient's seized mark in place
 */

#define N 3
#define NOBODY 3
#ifndef EPOCH_MAX
#define EPOCH_MAX 14
#endif
#ifndef REQ_MAX
#define REQ_MAX 1
#endif
#define CRASH_MAX 1
#define HANG_MAX 1
#define WRONG_MAX 1

/* node state (what the node itself remembers) */
byte holder[N];
bool in_cs[N];
bool asked[N];
byte q[9];                  /* node n's FIFO: q[3n .. 3n+2]; an entry is node + 4 * tag
                               (the requester's grant count when it asked); NOBODY: empty */
byte qlen[N];
byte req[N];                /* n's outstanding REQUEST is addressed to this node (NOBODY: none) */
byte reqtag[N];             /* ... and carries gcnt[n] as n knew it when it sent it */
bool live[N];
byte reqs_left[N];

/* lockd / the coordinator */
byte tok = 0;               /* the true holder of the privilege */
bool seized[N];             /* owes a reconciliation */
byte gcnt[N];               /* grants n received; carried with the privilege (Suzuki-Kasami's
                               LN), and known to n, which observes each of its grants */
byte cur = 1;               /* the epoch of the latest grant */
short issued[N];            /* bit e: token {n, e} was issued; never cleared */
byte seen = 1;              /* FenceGate: the highest epoch seen */
byte crashes_left = CRASH_MAX;
byte hangs_left = HANG_MAX;
byte wrong_left = WRONG_MAX;
bool hung[N];               /* n's critical section never ends by itself */

/* ghosts (read by no transition's guard) */
bool g_ready;               /* init has set the initial state */
bool g_waiting[N];          /* n asked for its critical section and has not entered it */
bool g_cs_stale;            /* a node entered its critical section not holding the privilege */
bool g_down_edit;           /* a step changed the state of a node that was down */
byte stale_upto = 0;        /* tokens with epoch <= stale_upto were passed on or seized */
bool g_entered;
bool g_seized;
bool g_seized_live;         /* a seizure from a live holder */
bool g_reconciled;
bool g_rejoined;            /* a node that was seized came back (recovered after reconciling) */
bool g_was_seized[N];

#define HEAD(n)        (q[3*(n)] & 3)
#define HEADTAG(n)     (q[3*(n)] >> 2)
#define INQ(n, x)      ((q[3*(n)] & 3) == (x) || (q[3*(n)+1] & 3) == (x) || (q[3*(n)+2] & 3) == (x))
/* the head of n's queue is another node's REQUEST sent since its latest grant */
#define HEAD_CURRENT(n) (HEADTAG(n) == gcnt[HEAD(n)])
#define HAS(n, e)      ((issued[n] >> (e)) & 1)
/* The gate is checked in every state rather than by a writer process: a node may present
 * any of its tokens at any time, and a write admitted by FenceGate::admit (epoch >= seen)
 * only raises `seen`, which makes later writes harder to admit; so a write could be admitted
 * in some run iff some reachable state has a token at or above `seen`. */
#define PASSES(n)      ((issued[n] >> seen) != 0)
/* i and j both hold a token of one epoch that the gate would admit */
#define TWO_AT(i, j)   (((issued[i] & issued[j]) >> seen) != 0)
/* n holds a stale token (epoch <= stale_upto) that the gate would admit */
#define STALE_PASSES(n) (stale_upto >= seen && ((issued[n] >> seen) & ((2 << (stale_upto - seen)) - 1)) != 0)
/* the coordinator may give the privilege to t: a live waiter that does not hold it */
#define CAN_GET(t)     ((/*@G seize_to_live*/ live[t]) && t != tok && (/*@G seize_to_waits*/ INQ(t, t)))
#define SUSPECT(n)     (hung[n] || !live[n] || wrong_left > 0)

inline enqueue(qn, qx) {
	q[3*qn + qlen[qn]] = qx; qlen[qn]++
}

inline dequeue(qn) {
	q[3*qn] = q[3*qn+1]; q[3*qn+1] = q[3*qn+2]; q[3*qn+2] = NOBODY; qlen[qn]--
}

/* Raymond's MAKE_REQUEST, run by n after every event at n: a live node that does not
 * believe it holds, has a queue and has no REQUEST outstanding asks its holder pointer */
inline make_request(mn) {
	if
	:: (/*@G send_live*/ live[mn]) && (/*@G send_not_holder*/ holder[mn] != mn) && qlen[mn] > 0 &&
	   (/*@G send_once*/ !asked[mn]) ->
		g_down_edit = g_down_edit || !live[mn];
		/*@E send_req*/ req[mn] = holder[mn]; reqtag[mn] = gcnt[mn]; /*@E send_asked*/ asked[mn] = true
	:: else
	fi
}

/* a grant: the privilege to `r` at a new epoch, announced to the gate in the same step */
inline issue(r) {
	assert(cur < EPOCH_MAX);
	/*@E grant_epoch*/ cur++;
	stale_upto = cur - 1;
	/*@E grant_issue*/ issued[r] = issued[r] | (1 << cur);
	/*@E grant_announce*/ seen = cur;
	/*@E grant_tok*/ tok = r;
	/*@E grant_belief*/ holder[r] = r;
	/*@E grant_counts*/ gcnt[r]++;
	/*@E grant_unasks*/ asked[r] = false;    /* any REQUEST of r still queued is now stale */
	g_was_seized[r] = false;
#ifndef GRANT_KEEPS_SEIZED_MARK
	/*@E grant_clears_mark*/ seized[r] = false
#else
	skip
#endif
}

proctype Node(byte n)
{
	byte h;
end_idle:
	do
	:: atomic {    /* Request: n wants its critical section */
		(/*@G request_live*/ live[n]) && reqs_left[n] > 0 && !in_cs[n] && !INQ(n, n) ->
		g_down_edit = g_down_edit || !live[n];
		reqs_left[n]--;
		enqueue(n, n);
		g_waiting[n] = true;
		make_request(n)
	   }
	:: atomic {    /* ReceiveRequest: a REQUEST addressed to n arrives; its sender joins n's
		        * queue unless it is there already */
		(/*@G receive_live*/ live[n]) && (req[0] == n || req[1] == n || req[2] == n) ->
		if
		:: req[0] == n -> h = 0
		:: req[1] == n -> h = 1
		:: req[2] == n -> h = 2
		fi;
		g_down_edit = g_down_edit || !live[n];
		if
		:: !INQ(n, h) -> /*@E receive_enqueue*/ enqueue(n, h + 4 * reqtag[h])
		:: (q[3*n] & 3) == h -> q[3*n] = h + 4 * reqtag[h]         /* a stale entry renewed */
		:: (q[3*n+1] & 3) == h -> q[3*n+1] = h + 4 * reqtag[h]
		:: (q[3*n+2] & 3) == h -> q[3*n+2] = h + 4 * reqtag[h]
		fi;
		req[h] = NOBODY; reqtag[h] = 0;
		make_request(n);
		h = 0
	   }
	:: atomic {    /* PassToken (ASSIGN_PRIVILEGE): the privilege to the head of n's queue */
#ifndef CRASHED_MAY_PASS
		(/*@G pass_live*/ live[n]) &&
#endif
		holder[n] == n && (/*@G pass_holds*/ tok == n) && (/*@G pass_idle*/ !in_cs[n]) &&
		qlen[n] > 0 && HEAD(n) != n && (/*@G pass_current*/ HEAD_CURRENT(n)) &&
		(/*@G pass_head_live*/ live[HEAD(n)]) ->
		h = HEAD(n);
		g_down_edit = g_down_edit || !live[n] || !live[h];
		dequeue(n);
		/*@E pass_aim*/ holder[n] = h;
		issue(h);
		make_request(n);
		h = 0
	   }
	:: atomic {    /* Discard: the head of the holder's queue is a REQUEST its sender sent
		        * before a later grant (a seizure for it, or one it got while stale): it
		        * asks for nothing any more */
		(/*@G discard_live*/ live[n]) && holder[n] == n && tok == n && qlen[n] > 0 && HEAD(n) != n &&
		(/*@G discard_stale*/ !HEAD_CURRENT(n)) ->
		g_down_edit = g_down_edit || !live[n];
		/*@E discard*/ dequeue(n)
	   }
	:: atomic {    /* EnterCS (ASSIGN_PRIVILEGE to itself) */
		(/*@G enter_live*/ live[n]) && (/*@G enter_believes*/ holder[n] == n) && !in_cs[n] &&
		qlen[n] > 0 && HEAD(n) == n && (/*@G enter_owes_nothing*/ !seized[n]) ->
		g_down_edit = g_down_edit || !live[n];
		g_cs_stale = g_cs_stale || tok != n;
		dequeue(n);
		/*@E enter*/ in_cs[n] = true;
		g_waiting[n] = false; g_entered = true;
		if
		:: hangs_left > 0 -> hangs_left--; hung[n] = true   /* never leaves by itself */
		:: true
		fi
	   }
	:: atomic {    /* ExitCS: the sandbox exits and the name is released */
		(/*@G exit_live*/ live[n]) && in_cs[n] && !hung[n] && (/*@G exit_owes_nothing*/ !seized[n]) ->
		g_down_edit = g_down_edit || !live[n];
		/*@E exit*/ in_cs[n] = false
	   }
	:: atomic {    /* Crash */
		live[n] && crashes_left > 0 ->
		crashes_left--; live[n] = false
	   }
	:: atomic {    /* Recover: refused while n owes a reconciliation */
#ifndef RECOVER_WITHOUT_RECONCILE
		!live[n] && (/*@G recover_reconciled*/ !seized[n]) ->
#else
		!live[n] ->
		seized[n] = false;   /* lockd takes the rejoined node as repaired; nothing was */
#endif
		g_rejoined = g_rejoined || g_was_seized[n];
		/*@E recover*/ live[n] = true;
		make_request(n)
	   }
	:: atomic {    /* Reconcile: drop the belief (live or down; n acts either way) */
		(/*@G reconcile_owed*/ seized[n]) && (/*@G reconcile_stale*/ tok != n) ->
		/*@E reconcile_leaves_cs*/ in_cs[n] = false; hung[n] = false;
		/*@E reconcile_aims*/ holder[n] = tok;
		/*@E reconcile_unasks*/ asked[n] = false;   /* a stale holder has no REQUEST out */
		/*@E reconcile_clears*/ seized[n] = false;
		g_reconciled = true;
		make_request(n)
	   }
	od
}

/* The coordinator (lockd on a holder it suspects): seize the privilege for a waiter. */
proctype Coordinator()
{
	byte to;
end_idle:
	do
	:: atomic {
#ifndef SEIZE_NEEDS_DEAD_VICTIM
		(/*@G seize_suspect*/ SUSPECT(tok)) &&
#else
		!live[tok] &&
#endif
		(CAN_GET(0) || CAN_GET(1) || CAN_GET(2)) ->
		if
		:: CAN_GET(0) -> to = 0
		:: CAN_GET(1) -> to = 1
		:: CAN_GET(2) -> to = 2
		fi;
		if
		:: true ->
			if
			:: live[tok] && !hung[tok] -> wrong_left--   /* a wrong suspicion */
			:: else
			fi;
			g_seized = true; g_seized_live = g_seized_live || live[tok];
			g_down_edit = g_down_edit || !live[to];
			/*@E seize_marks*/ seized[tok] = true;
			g_was_seized[tok] = true;
			issue(to)
		fi;
		to = 0
	   }
	od
}

init {
	atomic {
		byte i;
		for (i : 0 .. N-1) {
			live[i] = true; reqs_left[i] = REQ_MAX; req[i] = NOBODY;
			q[3*i] = NOBODY; q[3*i+1] = NOBODY; q[3*i+2] = NOBODY
		}
		holder[0] = 0; holder[1] = 0; holder[2] = 1;
		issued[0] = 2;                       /* token {0, 1}: node 0 holds at epoch 1 */
		g_ready = true;
		i = 0;
		run Node(0); run Node(1); run Node(2); run Coordinator()
	}
}

#define STALE_OWES(n)  (!(holder[n] == n && tok != n) || seized[n])

/* The true holder holds the token of the current epoch (no authority without a token). */
ltl HolderHasToken { [] (!g_ready || HAS(tok, cur)) }

/* One mutator per epoch: no two nodes ever have a write admitted at the same epoch, i.e.
 * never two nodes hold a token of one epoch that the gate would still admit. */
ltl OneMutatorPerEpoch { [] !(TWO_AT(0, 1) || TWO_AT(0, 2) || TWO_AT(1, 2)) }

/* Never two nodes each holding a token the gate would admit now. */
ltl SingleMutator { [] !((PASSES(0) && PASSES(1)) || (PASSES(0) && PASSES(2)) || (PASSES(1) && PASSES(2))) }

/* Stale tokens are inert: no token whose grant was passed on or seized is admitted. */
ltl StaleTokenRejected { [] !(STALE_PASSES(0) || STALE_PASSES(1) || STALE_PASSES(2)) }

/* No critical section is entered on a belief that was never reconciled: a node enters its
 * critical section only while it really holds the privilege. */
ltl NoCSOnStaleBelief { [] !g_cs_stale }

/* A node in its critical section believes it holds (a reconciliation ends the critical
 * section it drops the belief of). */
ltl CSOnlyWithBelief { [] ((!in_cs[0] || holder[0] == 0) && (!in_cs[1] || holder[1] == 1) && (!in_cs[2] || holder[2] == 2)) }

/* Every stale holder (believes it holds, does not) owes a reconciliation. */
ltl StaleHolderOwesReconcile { [] (STALE_OWES(0) && STALE_OWES(1) && STALE_OWES(2)) }

/* A step changes the state of a node only while that node takes part (is live); the one
 * exception is its own reconciliation. */
ltl NothingInstalledInADownNode { [] !g_down_edit }

/* Raymond's exclusion without epochs: never two nodes in their critical sections.
 * Expected to FAIL: between a seizure and the seized node's reconciliation the seized node
 * may still be inside (the window; its writes are fenced, StaleTokenRejected). */
ltl RaymondExclusion { [] !((in_cs[0] && in_cs[1]) || (in_cs[0] && in_cs[2]) || (in_cs[1] && in_cs[2])) }

/* Every waiter is eventually served (holders may hang or crash; the coordinator seizes). */
ltl EveryWaiterServed {
	[] ((g_waiting[0] -> <> !g_waiting[0]) && (g_waiting[1] -> <> !g_waiting[1]) &&
	    (g_waiting[2] -> <> !g_waiting[2]))
}

/* Every node that is down comes back. */
ltl EveryCrashRecovers {
	[] ((!live[0] -> <> live[0]) && (!live[1] -> <> live[1]) && (!live[2] -> <> live[2]))
}

/* Non-vacuity, expected to FAIL. */
ltl NeverEntered { [] !g_entered }
ltl NeverSeized { [] !g_seized }
ltl NeverSeizedLive { [] !g_seized_live }
ltl NeverReconciled { [] !g_reconciled }
ltl NeverRejoined { [] !g_rejoined }
