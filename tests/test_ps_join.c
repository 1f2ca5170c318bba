/* test_ps_join.c - membership of the parameter-server engine: a worker
   that joins mid-run, and a server that is lost (MEMBERSHIP and A LOST
   SERVER in distsgd/ps.h).

   2 servers (one variable of 3 floats each), 3 workers: workers 0 and 1
   are members from the start (initial_workers 2), worker 2 joins at
   clock K = 5 of a run to the target T = 24 (dsgd_ps_worker_run's stop
   rule: every worker ends at clock T), under ASYNC, SSP s = 2 and SYNC:
     - over the loopback, each member waits in after_pull at its clock K
       until the joiner has joined (dsgd_ps_worker_join); so every server
       is at version K (ASYNC: 2 K, both members' pushes) when the joiner
       prepares, and the join clock is exactly that;
     - over simnet (fibers; 1 s of compute per step, free links), the
       joiner starts at virtual time K + 0.5, when the members have pushed
       K times each: the same join clock; and again with worker 1's
       messages to server 1 delayed by 1 s from its clock K - 1 on, so
       that server 1 is a clock behind server 0 at the join (it counts
       the joiner from K - 1 until the commit moves that to K).
   What is asserted, on the values:
     - every rank returns DSGD_OK and no worker failed;
     - the joiner's join clock (its stats and every server's peer stats) is
       the one above, its first pull reads version >= it from every server
       (SYNC: exactly it), and its callbacks start at that clock;
     - the counts add up on every server: one join; each member pushed T
       gradients and the joiner T - join clock; each push applied (per
       worker and in all: pushes_received and pushes_applied are the
       sums); version T (ASYNC: every push);
     - the weights equal a serial reference: SYNC (gradients 0.5 p + an
       integer of (worker, clock, float), SGD lr 1) and SSP (integer
       gradients) apply, clock by clock, the mean over the workers counted
       for that clock (the members, and the joiner from its clock on), sum
       in worker order; ASYNC (integer gradients) the initial weights minus
       every pushed gradient. Bit for bit.
   BACKUP with 1 backup over simnet: every server ends at the target
   step, and applied 1 gradient a step before the join and 2 after (the
   quorum members - backups), the rest counted as dropped.
   Refusals: initial_workers out of range, late workers with summation
   only or with no more members than backups, checkpoints of a run with
   late workers; a late worker that never joins and does not finish makes
   the servers fail, naming it, timeout_s after the last member finished;
   one that finishes without joining ends the run.
   A lost server (SYNC and ASYNC): over the loopback, server 1's transport
   fails after 40 messages (its serve returns; it answers nothing more):
   every worker fails with DSGD_ERR_TIMEOUT naming server 1 (no answer,
   maybe with server 0 whose SYNC clock can no longer complete, or a send
   its full queue refused at the deadline) within
   timeout_s (+ 1 s of scheduling slack) of the death, server 0 then
   fails naming the silent workers, and nothing hangs (watchdog). Over
   simnet, a KILL of server 1 at virtual time 3.5: its serve returns
   DSGD_ERR_ABORTED, each worker fails with DSGD_ERR_TIMEOUT naming server
   1 at virtual time <= 3.5 + one compute + timeout_s, server 0 names the
   workers.

   Build: make test (this file is compiled without the implementation and
   linked against the library built once per variant).
   distsgd-test: tsan */
#include "harness.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { NP = 2, NW = 3, W0 = 2, EACH = 3, NF = NP * EACH, T = 24, K = 5, MSG = 512 };

/* ---------------------------------------------------------------- the run */

typedef struct jrun {
    dsgd_ps_desc d;
    dsgd_shard_map *map;
    float init[NF];
    int sim;          /* over simnet (dsgd_simnet_run), else the loopback's threads */
    dsgd_simnet *hub;
    int param_grad;   /* gradients 0.5 p + integer (SYNC), else integers */
    /* the loopback's meeting at clock K */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int at_k, joined;
    /* the lost-server runs */
    int die_after;    /* > 0: server 1's transport fails after this many messages */
    double t_death, t_fail[NP + NW];
    /* results, per rank */
    dsgd_result res[NP + NW];
    char msg[NP + NW][MSG];
    dsgd_ps_server_stats st[NP];
    dsgd_ps_peer_stats peer[NP][NW];
    float final[NF];
    dsgd_ps_worker_stats wst[NW];
    int failed[NW];
    int64_t first_v[NW][NP], first_step[NW];
    int pulls[NW];
    int bad;
    char bad_msg[MSG];
} jrun;

static float gint(int w, int64_t c, int j) { return (float)((w * 5 + (int)(c % 1000) * 3 + j * 7) % 9 - 4); }

static void note_bad(jrun *R, const char *what) {
    if (R->bad++) return;
    snprintf(R->bad_msg, MSG, "%s", what);
}

typedef struct jworker {
    jrun *R;
    int w;
    dsgd_ps_worker *pw;
} jworker;

static dsgd_result j_grad(void *user, int64_t step, const float *params, float *grads) {
    jworker *jw = (jworker *)user;
    int j;
    for (j = 0; j < NF; ++j) grads[j] = (jw->R->param_grad ? 0.5f * params[j] : 0.0f) + gint(jw->w, step, j);
    return jw->R->sim ? dsgd_simnet_compute(jw->R->hub, NP + jw->w, (long)step) : DSGD_OK;
}

static dsgd_result j_pulled(void *user, int64_t step, int64_t global, const float *params, int *stop) {
    jworker *jw = (jworker *)user;
    jrun *R = jw->R;
    int s;
    (void)global, (void)params, (void)stop;
    if (R->pulls[jw->w]++ == 0) {
        for (s = 0; s < NP; ++s) R->first_v[jw->w][s] = dsgd_ps_worker_version(jw->pw, s);
        R->first_step[jw->w] = step;
    }
    if (!R->sim && !R->die_after && jw->w < W0 && step == K) { /* wait here until the joiner joined */
        struct timespec until;
        int e = 0;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 20;
        pthread_mutex_lock(&R->mu);
        R->at_k++;
        pthread_cond_broadcast(&R->cv);
        while (!R->joined && e == 0) e = pthread_cond_timedwait(&R->cv, &R->mu, &until);
        pthread_mutex_unlock(&R->mu);
        if (e) note_bad(R, "a member waited 20 s for the joiner");
    }
    return DSGD_OK;
}

/* Worker w's program: the engine's loop to T (the joiner joins first). */
static dsgd_result j_worker(jrun *R, int w, dsgd_ctx *ctx, const dsgd_transport_i *t) {
    jworker jw;
    dsgd_ps_run_desc rd;
    dsgd_result r;
    memset(&jw, 0, sizeof jw);
    jw.R = R;
    jw.w = w;
    memset(&rd, 0, sizeof rd);
    rd.steps = R->die_after ? 1000000 : T;
    rd.grad = j_grad;
    rd.after_pull = j_pulled;
    rd.user = &jw;
    r = dsgd_ps_worker_create(ctx, t, &R->d, R->map, &jw.pw);
    if (r == DSGD_OK && w >= W0 && !R->die_after) {
        if (R->sim) {
            r = dsgd_simnet_advance(R->hub, NP + w, K + 0.5); /* its pull joins */
        } else {
            struct timespec until;
            int e = 0;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_sec += 20;
            pthread_mutex_lock(&R->mu);
            while (R->at_k < W0 && e == 0) e = pthread_cond_timedwait(&R->cv, &R->mu, &until);
            pthread_mutex_unlock(&R->mu);
            if (e) note_bad(R, "the joiner waited 20 s for the members to reach clock K");
            r = dsgd_ps_worker_join(jw.pw);
            pthread_mutex_lock(&R->mu);
            R->joined = 1;
            pthread_cond_broadcast(&R->cv);
            pthread_mutex_unlock(&R->mu);
        }
    }
    if (r == DSGD_OK) r = dsgd_ps_worker_run(jw.pw, &rd);
    R->t_fail[NP + w] = t->now ? t->now(t->impl) : dsgd_now();
    dsgd_ps_worker_get_stats(jw.pw, &R->wst[w]);
    R->failed[w] = dsgd_ps_worker_failed(jw.pw);
    dsgd_ps_worker_destroy(jw.pw);
    return r;
}

/* ---- a transport that dies: after die_after messages its probe fails */

typedef struct dying {
    dsgd_transport_i in;
    jrun *R;
    int left;
} dying;

static dsgd_result dying_send(void *impl, int dst, uint64_t tag, const void *buf, size_t bytes, double deadline) {
    dying *f = (dying *)impl;
    return f->in.send(f->in.impl, dst, tag, buf, bytes, deadline);
}

static dsgd_result dying_recv(void *impl, int src, uint64_t tag, void *buf, size_t bytes, double deadline) {
    dying *f = (dying *)impl;
    return f->in.recv(f->in.impl, src, tag, buf, bytes, deadline);
}

static dsgd_result dying_probe(void *impl, double deadline, int *src, uint64_t *tag, size_t *bytes) {
    dying *f = (dying *)impl;
    if (f->left-- <= 0) {
        f->R->t_death = dsgd_now();
        return DSGD_ERR_ABORTED;
    }
    return f->in.probe(f->in.impl, deadline, src, tag, bytes);
}

static const char *dying_error(void *impl) {
    (void)impl;
    return "the server's process died";
}

static dsgd_result j_server(jrun *R, int s, dsgd_ctx *ctx, const dsgd_transport_i *ep) {
    dsgd_ps_server *srv = NULL;
    dsgd_transport_i t = *ep;
    dying f;
    dsgd_result r;
    int w;
    if (R->die_after && s == 1 && !R->sim) {
        memset(&f, 0, sizeof f);
        f.in = *ep;
        f.R = R;
        f.left = R->die_after;
        memset(&t, 0, sizeof t);
        t.name = "dying";
        t.impl = &f;
        t.rank = ep->rank;
        t.size = ep->size;
        t.send = dying_send;
        t.recv = dying_recv;
        t.probe = dying_probe;
        t.error_message = dying_error;
    }
    r = dsgd_ps_server_create(ctx, &t, &R->d, R->map, R->init, &srv);
    if (r == DSGD_OK) r = dsgd_ps_server_serve(srv);
    R->t_fail[s] = ep->now ? ep->now(ep->impl) : dsgd_now();
    if (r == DSGD_OK) {
        dsgd_ps_server_get_stats(srv, &R->st[s]);
        R->st[s].staleness_hist = NULL;
        for (w = 0; w < NW && r == DSGD_OK; ++w) r = dsgd_ps_server_get_peer_stats(srv, w, &R->peer[s][w]);
        if (r == DSGD_OK) r = dsgd_ps_server_read_params(srv, R->final);
    }
    dsgd_ps_server_destroy(srv);
    return r;
}

static void j_rank(jrun *R, int rank, const dsgd_transport_i *t) {
    dsgd_ctx *ctx = NULL;
    dsgd_result r;
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) {
        R->res[rank] = DSGD_ERR_OUT_OF_MEMORY;
        return;
    }
    r = rank < NP ? j_server(R, rank, ctx, t) : j_worker(R, rank - NP, ctx, t);
    R->res[rank] = r;
    snprintf(R->msg[rank], MSG, "%s", r == DSGD_OK ? "" : dsgd_ctx_last_error(ctx));
    dsgd_ctx_destroy(ctx);
}

typedef struct j_arg {
    jrun *R;
    int rank;
    dsgd_transport_i t;
} j_arg;

static void *j_thread(void *p) {
    j_arg *a = (j_arg *)p;
    j_rank(a->R, a->rank, &a->t);
    return NULL;
}

static void j_fiber(dsgd_simnet *hub, int rank, const dsgd_transport_i *ep, void *user) {
    j_rank((jrun *)user, rank, ep);
    dsgd_simnet_leave(hub, rank);
}

static void j_setup(jrun *R, dsgd_ps_policy policy, int sim, dsgd_ctx *ctx) {
    dsgd_variable vars[NP];
    int i;
    memset(R, 0, sizeof *R);
    R->sim = sim;
    R->param_grad = policy == DSGD_PS_SYNC;
    R->d.num_servers = NP;
    R->d.num_workers = NW;
    R->d.initial_workers = W0;
    R->d.policy = policy;
    R->d.staleness = policy == DSGD_PS_SSP ? 2 : 0;
    R->d.optimizer.kind = DSGD_OPT_SGD;
    R->d.optimizer.lr = 1.0f;
    R->d.timeout_s = sim ? 2.0 : 10.0;
    memset(vars, 0, sizeof vars);
    for (i = 0; i < NP; ++i) {
        snprintf(vars[i].name, DSGD_MAX_NAME, "v%d", i);
        vars[i].offset = (size_t)i * EACH;
        vars[i].count = EACH;
        vars[i].rank = 1;
        vars[i].shape[0] = EACH;
    }
    TU_OK(ctx, dsgd_shard_map_create(ctx, vars, NP, NP, NULL, &R->map));
    for (i = 0; i < NF; ++i) R->init[i] = (float)(i % 5 - 2);
    pthread_mutex_init(&R->mu, NULL);
    pthread_cond_init(&R->cv, NULL);
}

static void j_go(jrun *R, dsgd_ctx *ctx, const dsgd_simnet_fault *faults, int num_faults) {
    int i;
    if (R->sim) {
        dsgd_simnet_desc sd;
        memset(&sd, 0, sizeof sd);
        sd.ranks = NP + NW;
        sd.compute.kind = DSGD_SIMNET_COMPUTE_CONSTANT;
        sd.compute.mean_s = 1.0;
        sd.faults = faults;
        sd.num_faults = num_faults;
        TU_OK(ctx, dsgd_simnet_create(ctx, &sd, &R->hub));
        TU_OK(ctx, dsgd_simnet_run(R->hub, j_fiber, R));
        dsgd_simnet_destroy(R->hub);
        R->hub = NULL;
    } else {
        dsgd_loopback *lb = NULL;
        pthread_t th[NP + NW];
        j_arg args[NP + NW];
        TU_OK(ctx, dsgd_loopback_create(ctx, NP + NW, &lb));
        for (i = 0; i < NP + NW; ++i) {
            args[i].R = R;
            args[i].rank = i;
            TU_OK(ctx, dsgd_loopback_endpoint(lb, i, &args[i].t));
        }
        for (i = 0; i < NP + NW; ++i) assert_int_equal(pthread_create(&th[i], NULL, j_thread, &args[i]), 0);
        for (i = 0; i < NP + NW; ++i) assert_int_equal(pthread_join(th[i], NULL), 0);
        dsgd_loopback_destroy(lb);
    }
}

static void j_free(jrun *R) {
    dsgd_shard_map_destroy(R->map);
    pthread_mutex_destroy(&R->mu);
    pthread_cond_destroy(&R->cv);
}

/* ---------------------------------------------------------------- a worker joins */

/* The weights a run with the joiner counted from clock b must end with. */
static void reference(const jrun *R, int64_t b, float *p) {
    int64_t c;
    int j, w;
    memcpy(p, R->init, sizeof R->init);
    if (R->d.policy == DSGD_PS_ASYNC) { /* lr 1, integer gradients: init minus every push */
        for (w = 0; w < NW; ++w)
            for (c = w < W0 ? 0 : b; c < T; ++c)
                for (j = 0; j < NF; ++j) p[j] -= gint(w, c, j);
        return;
    }
    for (c = 0; c < T; ++c) { /* one update per clock: the mean of the workers counted */
        float sum[NF], g;
        int cnt = 0;
        for (w = 0; w < NW; ++w) {
            if (w >= W0 && c < b) continue;
            for (j = 0; j < NF; ++j) {
                g = (R->param_grad ? 0.5f * p[j] : 0.0f) + gint(w, c, j);
                sum[j] = cnt ? sum[j] + g : g;
            }
            cnt++;
        }
        for (j = 0; j < NF; ++j) p[j] = p[j] - sum[j] / (float)cnt;
    }
}

static void join_case(dsgd_ps_policy policy, int sim, int skew) {
    dsgd_ctx *ctx = tu_ctx();
    static jrun R;
    dsgd_simnet_fault late;
    float want[NF];
    int64_t b = policy == DSGD_PS_ASYNC ? (int64_t)W0 * K : K, sum_p, sum_a;
    int i, s, w;
    j_setup(&R, policy, sim, ctx);
    /* skew: worker 1's messages to server 1 from its step K - 1 on arrive
       1 s late, so at the join server 1 lacks its push of clock K - 1
       (ASYNC: is one version behind) and counts the joiner from there
       until the commit moves it to server 0's clock */
    memset(&late, 0, sizeof late);
    late.kind = DSGD_SIMNET_FAULT_DELAY;
    late.rank = NP + 1;
    late.peer = 1;
    late.step = K - 1;
    late.seconds = 1.0;
    late.count = 1000000;
    if (skew) R.d.timeout_s = R.d.retry_s = 10.0;
    j_go(&R, ctx, &late, skew);
    for (i = 0; i < NP + NW; ++i)
        if (R.res[i] != DSGD_OK) fail_msg("rank %d: %s: %s", i, dsgd_result_string(R.res[i]), R.msg[i]);
    if (R.bad) fail_msg("%s", R.bad_msg);
    for (w = 0; w < NW; ++w) assert_int_equal(R.failed[w], 0);
    /* the join clock, everywhere, and the joiner's first pull */
    assert_int_equal(R.wst[W0].joined_at, b);
    assert_int_equal(R.wst[0].joined_at, 0);
    assert_int_equal(R.first_step[W0], b);
    for (s = 0; s < NP; ++s) { /* ASYNC does not wait: each server's version at the join, or later */
        assert_true(R.first_v[W0][s] >= (policy == DSGD_PS_ASYNC && skew && s == 1 ? b - 1 : b));
        if (policy == DSGD_PS_SYNC) assert_int_equal(R.first_v[W0][s], b);
    }
    for (s = 0; s < NP; ++s) {
        const dsgd_ps_server_stats *st = &R.st[s];
        assert_int_equal(st->joins, 1);
        sum_p = sum_a = 0;
        for (w = 0; w < NW; ++w) {
            const dsgd_ps_peer_stats *pe = &R.peer[s][w];
            int64_t pushes = w < W0 ? T : T - b;
            assert_int_equal(pe->member, 1);
            assert_int_equal(pe->finished, 1);
            assert_int_equal(pe->joined_at, w < W0 ? 0 : b);
            assert_int_equal(pe->pushes, pushes);
            assert_int_equal(pe->applied, pushes);
            assert_int_equal(R.wst[w].clock, pushes);
            sum_p += pe->pushes;
            sum_a += pe->applied;
        }
        assert_int_equal(st->pushes_received, sum_p);
        assert_int_equal(st->pushes_applied, sum_a);
        assert_int_equal(st->version, policy == DSGD_PS_ASYNC ? sum_p : T);
    }
    reference(&R, R.wst[W0].joined_at, want);
    for (i = 0; i < NF; ++i)
        if (memcmp(&R.final[i], &want[i], sizeof(float)) != 0)
            fail_msg("%s: float %d is %.9g, the serial reference %.9g", dsgd_ps_policy_name(policy), i,
                     (double)R.final[i], (double)want[i]);
    /* the reference tells a joiner counted one clock off apart */
    reference(&R, R.wst[W0].joined_at + 1, want);
    assert_true(memcmp(R.final, want, sizeof want) != 0);
    print_message("%s over %s%s: worker 2 joined at clock %lld (first pull read %lld, %lld), pushed %lld; servers at "
                  "version %lld, %lld gradients applied each; the serial reference's bits\n",
                  dsgd_ps_policy_name(policy), sim ? "simnet" : "the loopback",
                  skew ? " (server 1 a clock behind at the join)" : "", (long long)b,
                  (long long)R.first_v[W0][0], (long long)R.first_v[W0][1], (long long)R.wst[W0].clock,
                  (long long)R.st[0].version, (long long)R.st[0].pushes_applied);
    j_free(&R);
    dsgd_ctx_destroy(ctx);
}

/* BACKUP 1 backup over simnet: the joiner enters the quorum at its clock:
   a step takes the first members - 1 gradients, 1 before the join and 2
   after. */
static void test_join_backup(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    static jrun R;
    int64_t sum_p, sum_a, sum_d;
    int i, s, w;
    (void)state;
    tu_watchdog(60);
    j_setup(&R, DSGD_PS_BACKUP, 1, ctx);
    R.d.backup_workers = 1;
    j_go(&R, ctx, NULL, 0);
    for (i = 0; i < NP + NW; ++i)
        if (R.res[i] != DSGD_OK) fail_msg("rank %d: %s: %s", i, dsgd_result_string(R.res[i]), R.msg[i]);
    assert_int_equal(R.wst[W0].joined_at, K);
    for (s = 0; s < NP; ++s) {
        const dsgd_ps_server_stats *st = &R.st[s];
        assert_int_equal(st->version, T);
        assert_int_equal(st->joins, 1);
        assert_int_equal(st->pushes_applied, (int64_t)K * (W0 - 1) + (int64_t)(T - K) * (NW - 1));
        sum_p = sum_a = sum_d = 0;
        for (w = 0; w < NW; ++w) {
            assert_int_equal(R.peer[s][w].joined_at, w < W0 ? 0 : K);
            assert_int_equal(R.peer[s][w].pushes, R.wst[w].clock);
            sum_p += R.peer[s][w].pushes;
            sum_a += R.peer[s][w].applied;
            sum_d += R.wst[w].pushes_dropped;
        }
        assert_int_equal(st->pushes_received, sum_p);
        assert_int_equal(st->pushes_applied, sum_a);
        assert_int_equal(st->stale_dropped * NP, sum_d); /* each drop is one (push, server) slice */
        assert_int_equal(st->pushes_received, st->pushes_applied + st->stale_dropped);
    }
    print_message("BACKUP 2 + 1 over simnet: worker 2 joined at step %d; %lld gradients applied (1 a step before, 2 "
                  "after), %lld dropped\n", K, (long long)R.st[0].pushes_applied, (long long)R.st[0].stale_dropped);
    j_free(&R);
    dsgd_ctx_destroy(ctx);
    tu_watchdog(0);
}

static void test_join_loopback(void **state) {
    (void)state;
    tu_watchdog(120);
    join_case(DSGD_PS_ASYNC, 0, 0);
    join_case(DSGD_PS_SSP, 0, 0);
    join_case(DSGD_PS_SYNC, 0, 0);
    tu_watchdog(0);
}

static void test_join_simnet(void **state) {
    (void)state;
    tu_watchdog(120);
    int skew;
    for (skew = 0; skew < 2; ++skew) {
        join_case(DSGD_PS_ASYNC, 1, skew);
        join_case(DSGD_PS_SSP, 1, skew);
        join_case(DSGD_PS_SYNC, 1, skew);
    }
    tu_watchdog(0);
}

/* ---------------------------------------------------------------- refusals and absent joiners */

static void test_join_refusals(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    static jrun R;
    dsgd_loopback *lb = NULL;
    dsgd_transport_i t[NP + NW];
    dsgd_ps_server *srv = NULL;
    dsgd_ps_worker *pw = NULL;
    dsgd_ps_desc d;
    dsgd_ps_peer_stats ps;
    int i;
    (void)state;
    j_setup(&R, DSGD_PS_SYNC, 0, ctx);
    TU_OK(ctx, dsgd_loopback_create(ctx, NP + NW, &lb));
    for (i = 0; i < NP + NW; ++i) TU_OK(ctx, dsgd_loopback_endpoint(lb, i, &t[i]));
    d = R.d;
    d.initial_workers = NW + 1;
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_ps_server_create(ctx, &t[0], &d, R.map, R.init, &srv));
    assert_non_null(strstr(dsgd_ctx_last_error(ctx), "initial_workers 4"));
    d.initial_workers = -1;
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_ps_worker_create(ctx, &t[NP], &d, R.map, &pw));
    d = R.d;
    d.apply = DSGD_PS_APPLY_ON_WORKERS;
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_ps_server_create(ctx, &t[0], &d, R.map, R.init, &srv));
    assert_non_null(strstr(dsgd_ctx_last_error(ctx), "need apply ON_SERVERS"));
    d = R.d;
    d.policy = DSGD_PS_BACKUP;
    d.backup_workers = 2;
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_ps_server_create(ctx, &t[0], &d, R.map, R.init, &srv));
    assert_non_null(strstr(dsgd_ctx_last_error(ctx), "must exceed backup_workers"));
    /* checkpoints */
    TU_OK(ctx, dsgd_ps_server_create(ctx, &t[0], &R.d, R.map, R.init, &srv));
    TU_ERR(ctx, DSGD_ERR_UNSUPPORTED, dsgd_ps_server_save(srv, "/tmp/never-written.ps"));
    assert_non_null(strstr(dsgd_ctx_last_error(ctx), "late workers"));
    TU_ERR(ctx, DSGD_ERR_UNSUPPORTED, dsgd_ps_server_restore(srv, "/tmp/never-written.ps"));
    TU_OK(ctx, dsgd_ps_server_get_peer_stats(srv, W0, &ps));
    assert_int_equal(ps.member, 0);
    assert_int_equal(ps.joined_at, -1);
    TU_OK(ctx, dsgd_ps_server_get_peer_stats(srv, 0, &ps));
    assert_int_equal(ps.member, 1);
    assert_int_equal(ps.joined_at, 0);
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_ps_server_get_peer_stats(srv, NW, &ps));
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_ps_server_get_peer_stats(srv, 0, NULL));
    TU_OK(ctx, dsgd_ps_worker_create(ctx, &t[NP + W0], &R.d, R.map, &pw));
    TU_ERR(ctx, DSGD_ERR_UNSUPPORTED, dsgd_ps_worker_save(pw, "/tmp/never-written.ps"));
    {
        dsgd_ps_worker_stats ws;
        dsgd_ps_worker_get_stats(pw, &ws);
        assert_int_equal(ws.joined_at, -1);
    }
    dsgd_ps_worker_destroy(pw);
    dsgd_ps_server_destroy(srv);
    dsgd_loopback_destroy(lb);
    j_free(&R);
    dsgd_ctx_destroy(ctx);
}

/* A late worker that never comes: the servers fail naming it, timeout_s
   after the last member finished; one that finishes unjoined ends it. */
static dsgd_result absent_worker(jrun *R, int w, dsgd_ctx *ctx, const dsgd_transport_i *t, int finish) {
    dsgd_ps_worker *pw = NULL;
    dsgd_ps_run_desc rd;
    jworker jw;
    dsgd_result r = dsgd_ps_worker_create(ctx, t, &R->d, R->map, &pw);
    memset(&jw, 0, sizeof jw);
    jw.R = R;
    jw.w = w;
    jw.pw = pw;
    memset(&rd, 0, sizeof rd);
    rd.steps = 4;
    rd.grad = j_grad;
    rd.user = &jw;
    if (r == DSGD_OK && w < W0) r = dsgd_ps_worker_run(pw, &rd);
    if (r == DSGD_OK && w >= W0 && finish) r = dsgd_ps_worker_finish(pw);
    dsgd_ps_worker_destroy(pw);
    return r;
}

typedef struct absent_arg {
    jrun *R;
    int rank, finish;
    dsgd_transport_i t;
    double t_end;
} absent_arg;

static void *absent_thread(void *p) {
    absent_arg *a = (absent_arg *)p;
    dsgd_ctx *ctx = NULL;
    dsgd_result r;
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) return NULL;
    r = a->rank < NP ? j_server(a->R, a->rank, ctx, &a->t) : absent_worker(a->R, a->rank - NP, ctx, &a->t, a->finish);
    a->R->res[a->rank] = r;
    snprintf(a->R->msg[a->rank], MSG, "%s", r == DSGD_OK ? "" : dsgd_ctx_last_error(ctx));
    a->t_end = dsgd_now();
    dsgd_ctx_destroy(ctx);
    return NULL;
}

static void test_join_absent(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    static jrun R;
    int finish, i;
    (void)state;
    tu_watchdog(60);
    for (finish = 0; finish < 2; ++finish) {
        dsgd_loopback *lb = NULL;
        pthread_t th[NP + NW];
        absent_arg a[NP + NW];
        double members_done = 0;
        j_setup(&R, DSGD_PS_SYNC, 0, ctx);
        R.d.timeout_s = 0.5;
        TU_OK(ctx, dsgd_loopback_create(ctx, NP + NW, &lb));
        for (i = 0; i < NP + NW; ++i) {
            a[i].R = &R;
            a[i].rank = i;
            a[i].finish = finish;
            TU_OK(ctx, dsgd_loopback_endpoint(lb, i, &a[i].t));
            assert_int_equal(pthread_create(&th[i], NULL, absent_thread, &a[i]), 0);
        }
        for (i = 0; i < NP + NW; ++i) assert_int_equal(pthread_join(th[i], NULL), 0);
        for (i = NP; i < NP + W0; ++i) {
            if (R.res[i] != DSGD_OK) fail_msg("worker %d: %s", i - NP, R.msg[i]);
            if (a[i].t_end > members_done) members_done = a[i].t_end;
        }
        for (i = 0; i < NP; ++i) {
            if (finish) {
                if (R.res[i] != DSGD_OK) fail_msg("server %d: %s", i, R.msg[i]);
                assert_int_equal(R.st[i].version, 4);
                assert_int_equal(R.st[i].joins, 0);
                assert_int_equal(R.peer[i][W0].member, 0);
                assert_int_equal(R.peer[i][W0].finished, 1);
            } else {
                assert_int_equal(R.res[i], DSGD_ERR_TIMEOUT);
                assert_non_null(strstr(R.msg[i], "worker 2 (rank 4, a late worker that never joined)"));
                assert_true(a[i].t_end - members_done >= 0.5 - 0.05);
                assert_true(a[i].t_end - members_done < 0.5 + 2.0);
            }
        }
        if (!finish) print_message("a late worker that never joined: \"%s\"\n", R.msg[0]);
        dsgd_loopback_destroy(lb);
        j_free(&R);
    }
    dsgd_ctx_destroy(ctx);
    tu_watchdog(0);
}

/* ---------------------------------------------------------------- a lost server */

/* Whether a worker's message names server s: "from server s within",
   "from servers a, b, s within" (under SYNC the live servers, whose clock
   can no longer complete, may be named beside the lost one), or "to
   server s failed". */
static int names_server(const char *msg, int s) {
    char want[32];
    const char *p = strstr(msg, "from server");
    snprintf(want, sizeof want, "to server %d failed", s);
    if (strstr(msg, want)) return 1;
    if (!p) return 0;
    p += strlen("from server");
    if (*p == 's') p++;
    for (;;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p) return 0;
        if (v == s) return 1;
        if (strncmp(end, ", ", 2) != 0) return 0;
        p = end + 2;
    }
}

static void lost_case(dsgd_ps_policy policy, int sim) {
    dsgd_ctx *ctx = tu_ctx();
    static jrun R;
    dsgd_simnet_fault kill;
    double to, last = 0;
    int i;
    j_setup(&R, policy, sim, ctx);
    R.d.initial_workers = 0; /* every worker from the start */
    R.d.timeout_s = to = sim ? 2.0 : 0.5;
    R.die_after = 40;
    memset(&kill, 0, sizeof kill);
    kill.kind = DSGD_SIMNET_FAULT_KILL;
    kill.rank = 1;
    kill.step = -1;
    kill.time = 3.5;
    j_go(&R, ctx, &kill, sim ? 1 : 0);
    if (sim) R.t_death = 3.5;
    assert_int_equal(R.res[1], DSGD_ERR_ABORTED);
    for (i = NP; i < NP + NW; ++i) {
        double dt = R.t_fail[i] - R.t_death;
        if (R.res[i] != DSGD_ERR_TIMEOUT || !names_server(R.msg[i], 1) || names_server(R.msg[i], 2))
            fail_msg("worker %d: %s: %s", i - NP, dsgd_result_string(R.res[i]), R.msg[i]);
        assert_int_equal(R.failed[i - NP], 1);
        /* within timeout_s of its request: simnet's one compute (1 s) in
           between, the loopback's scheduling slack */
        assert_true(dt >= 0.0);
        assert_true(dt <= to + (sim ? 1.0 + 1e-9 : 1.0));
        if (R.t_fail[i] > last) last = R.t_fail[i];
    }
    /* server 0 names the workers it heard nothing from: all three, or
       fewer where one reached it once more before failing (under load) */
    if (R.res[0] != DSGD_ERR_TIMEOUT || !strstr(R.msg[0], "no message from worker"))
        fail_msg("server 0: %s: %s", dsgd_result_string(R.res[0]), R.msg[0]);
    assert_true(R.t_fail[0] - last <= to + (sim ? 1e-9 : 1.0));
    print_message("lost server (%s over %s): workers fail %.3f s after the death (timeout_s %g): \"%s\"; server 0: "
                  "\"%s\"\n", dsgd_ps_policy_name(policy), sim ? "simnet" : "the loopback", last - R.t_death, to,
                  R.msg[NP], R.msg[0]);
    j_free(&R);
    dsgd_ctx_destroy(ctx);
}

static void test_lost_server(void **state) {
    (void)state;
    tu_watchdog(120);
    assert_true(names_server("w: no parameters from servers 0, 1 within 0.5 s", 1));
    assert_true(names_server("w: no acknowledgement from server 1 within 0.5 s", 1));
    assert_true(names_server("w: resending to server 1 failed: deadline expired", 1));
    assert_false(names_server("w: no parameters from servers 0, 2 within 0.5 s", 1));
    assert_false(names_server("w: no parameters from server 0 within 0.5 s", 1));
    lost_case(DSGD_PS_SYNC, 0);
    lost_case(DSGD_PS_ASYNC, 0);
    lost_case(DSGD_PS_SYNC, 1);
    lost_case(DSGD_PS_ASYNC, 1);
    tu_watchdog(0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_join_refusals),
        cmocka_unit_test(test_join_loopback),
        cmocka_unit_test(test_join_simnet),
        cmocka_unit_test(test_join_backup),
        cmocka_unit_test(test_join_absent),
        cmocka_unit_test(test_lost_server),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
