/* test_loopback.c - the loopback transport (distsgd/loopback.h): ranks as
   threads of one process, messages through their inboxes.

   - probe (receive from any source): every message arrives once, in order
     per source, at its size, across the eager and rendezvous paths; with
     every inbox full the reports go round-robin; a prober with no sender
     times out at its deadline and an abort wakes it;
   - probe_from (one source's messages): that source's, in order, never
     another's; never gone; a timeout at its deadline.
   The collectives over the loopback (every algorithm, mismatches, late and
   missing ranks, aborts) are tested in test_collectives.c.

   Build: make test (this file is compiled without the implementation and
   linked against the library built once per variant).
   distsgd-test: tsan */
#include "harness.h"

/* probe (receive from any source): 4 senders x 40 messages to rank 0, sizes
   alternating eager and rendezvous (> 64 KiB), tags (src << 32 | i); rank 0
   probes and receives each at the reported size. Every message arrives
   once, in order per source, with its bytes. With every inbox already full
   the reports go round-robin. A prober with no sender times out at its
   deadline, and an abort wakes it. */
#define PROBE_SENDERS 4
#define PROBE_MSGS 40
typedef struct probe_sender {
    dsgd_transport_i t;
    int rank, eager_only;
    dsgd_result res;
} probe_sender;

static size_t probe_bytes(int src, int i, int eager_only) {
    return eager_only ? (size_t)(4 * (src + i + 1)) : (i % 3 == 0 ? (size_t)70000 * 4 : (size_t)(4 * (src * 7 + i)));
}

static void *probe_sender_main(void *arg) {
    probe_sender *p = (probe_sender *)arg;
    int i, msgs = p->eager_only ? 4 : PROBE_MSGS;
    p->res = DSGD_OK;
    for (i = 0; i < msgs && p->res == DSGD_OK; ++i) {
        size_t n = probe_bytes(p->rank, i, p->eager_only) / 4, k;
        float *buf = (float *)malloc(n ? n * 4 : 4);
        for (k = 0; k < n; ++k) buf[k] = (float)(p->rank * 100000 + i * 1000 + (int)(k % 1000));
        p->res = p->t.send(p->t.impl, 0, ((uint64_t)p->rank << 32) | (uint64_t)i, buf, n * 4, dsgd_now() + 20);
        free(buf);
    }
    return NULL;
}

static void probe_run(int eager_only, int *order) {
    dsgd_ctx *ctx = NULL;
    dsgd_loopback *hub = NULL;
    dsgd_transport_i t0;
    probe_sender snd[PROBE_SENDERS];
    pthread_t th[PROBE_SENDERS];
    int next[PROBE_SENDERS + 1] = {0}, r, got, msgs = eager_only ? 4 : PROBE_MSGS;
    assert_int_equal(dsgd_ctx_create(NULL, &ctx), DSGD_OK);
    assert_int_equal(dsgd_loopback_create(ctx, PROBE_SENDERS + 1, &hub), DSGD_OK);
    assert_int_equal(dsgd_loopback_endpoint(hub, 0, &t0), DSGD_OK);
    assert_non_null(t0.probe);
    for (r = 0; r < PROBE_SENDERS; ++r) {
        snd[r].rank = r + 1;
        snd[r].eager_only = eager_only;
        assert_int_equal(dsgd_loopback_endpoint(hub, r + 1, &snd[r].t), DSGD_OK);
        assert_int_equal(pthread_create(&th[r], NULL, probe_sender_main, &snd[r]), 0);
        if (eager_only) assert_int_equal(pthread_join(th[r], NULL), 0); /* all queued before the first probe */
    }
    for (got = 0; got < PROBE_SENDERS * msgs; ++got) {
        int src = -2;
        uint64_t tag = 0;
        size_t bytes = 0, n, k;
        float *buf;
        assert_int_equal(t0.probe(t0.impl, dsgd_now() + 20, &src, &tag, &bytes), DSGD_OK);
        assert_true(src >= 1 && src <= PROBE_SENDERS);
        if (order) order[got] = src;
        assert_true(tag == (((uint64_t)src << 32) | (uint64_t)next[src]));
        assert_true(bytes == probe_bytes(src, next[src], eager_only));
        n = bytes / 4;
        buf = (float *)malloc(n ? n * 4 : 4);
        assert_int_equal(t0.recv(t0.impl, src, tag, buf, bytes, dsgd_now() + 20), DSGD_OK);
        for (k = 0; k < n; ++k)
            if (buf[k] != (float)(src * 100000 + next[src] * 1000 + (int)(k % 1000)))
                fail_msg("message %d of rank %d: float %zu is %g", next[src], src, k, (double)buf[k]);
        free(buf);
        next[src]++;
    }
    for (r = 0; r < PROBE_SENDERS; ++r) {
        if (!eager_only) assert_int_equal(pthread_join(th[r], NULL), 0);
        assert_int_equal(snd[r].res, DSGD_OK);
        assert_int_equal(next[r + 1], msgs);
    }
    dsgd_loopback_destroy(hub);
    dsgd_ctx_destroy(ctx);
}

static void *probe_abort_main(void *arg) {
    struct timespec ts = {0, 100 * 1000 * 1000};
    nanosleep(&ts, NULL);
    dsgd_loopback_abort((dsgd_loopback *)arg);
    return NULL;
}

static void test_probe_any_source(void **state) {
    dsgd_ctx *ctx = NULL;
    dsgd_loopback *hub = NULL;
    dsgd_transport_i t0;
    pthread_t th;
    int order[PROBE_SENDERS * 4], i, src = 5;
    uint64_t tag;
    size_t bytes;
    double t_start, waited;
    (void)state;
    tu_watchdog(120);
    probe_run(0, NULL);
    probe_run(1, order);
    for (i = 0; i < PROBE_SENDERS * 4; ++i)
        if (order[i] != 1 + i % PROBE_SENDERS) fail_msg("report %d came from rank %d, not %d (round-robin)", i, order[i], 1 + i % PROBE_SENDERS);

    assert_int_equal(dsgd_ctx_create(NULL, &ctx), DSGD_OK);
    assert_int_equal(dsgd_loopback_create(ctx, 3, &hub), DSGD_OK);
    assert_int_equal(dsgd_loopback_endpoint(hub, 0, &t0), DSGD_OK);
    t_start = dsgd_now();
    assert_int_equal(t0.probe(t0.impl, t_start + 0.2, &src, &tag, &bytes), DSGD_ERR_TIMEOUT);
    waited = dsgd_now() - t_start;
    assert_true(waited >= 0.2 && waited < 2.0);
    assert_int_equal(src, -1);
    assert_non_null(strstr(t0.error_message(t0.impl), "deadline passed while waiting for a message from any rank"));
    assert_int_equal(t0.probe(t0.impl, t_start + 1, NULL, &tag, &bytes), DSGD_ERR_INVALID_ARGUMENT);
    assert_int_equal(pthread_create(&th, NULL, probe_abort_main, hub), 0);
    t_start = dsgd_now();
    assert_int_equal(t0.probe(t0.impl, t_start + 20, &src, &tag, &bytes), DSGD_ERR_ABORTED);
    assert_true(dsgd_now() - t_start < 10.0);
    assert_non_null(strstr(t0.error_message(t0.impl), "aborted while waiting for a message from any rank"));
    assert_int_equal(pthread_join(th, NULL), 0);
    dsgd_loopback_destroy(hub);
    dsgd_ctx_destroy(ctx);
    tu_watchdog(0);
}

/* probe_from (one source's messages): rank 2 sends rank 0 two floats
   (tags 7, 8) and rank 1 one (tag 9), all queued before rank 0 asks;
   probe_from(2) reports rank 2's first (tag 7, 4 bytes), never rank
   1's, and again after it is received, its second; nothing here is ever
   gone. With nothing from rank 1 left it times out at its deadline; its
   own rank as src is DSGD_ERR_INVALID_ARGUMENT. */
static void test_probe_from(void **state) {
    dsgd_ctx *ctx = NULL;
    dsgd_loopback *hub = NULL;
    dsgd_transport_i t[3];
    float v = 1.0f;
    uint64_t tag = 0;
    size_t bytes = 0;
    int i, gone = 5;
    double t_start;
    (void)state;
    tu_watchdog(60);
    assert_int_equal(dsgd_ctx_create(NULL, &ctx), DSGD_OK);
    assert_int_equal(dsgd_loopback_create(ctx, 3, &hub), DSGD_OK);
    for (i = 0; i < 3; ++i) assert_int_equal(dsgd_loopback_endpoint(hub, i, &t[i]), DSGD_OK);
    assert_non_null(t[0].probe_from);
    assert_int_equal(t[1].send(t[1].impl, 0, 9, &v, sizeof(v), dsgd_now() + 5), DSGD_OK);
    assert_int_equal(t[2].send(t[2].impl, 0, 7, &v, sizeof(v), dsgd_now() + 5), DSGD_OK);
    assert_int_equal(t[2].send(t[2].impl, 0, 8, &v, sizeof(v), dsgd_now() + 5), DSGD_OK);
    for (i = 7; i <= 8; ++i) {
        assert_int_equal(t[0].probe_from(t[0].impl, 2, dsgd_now() + 5, &tag, &bytes, &gone), DSGD_OK);
        assert_true(tag == (uint64_t)i && bytes == sizeof(v) && gone == 0);
        assert_int_equal(t[0].recv(t[0].impl, 2, tag, &v, bytes, dsgd_now() + 5), DSGD_OK);
    }
    assert_int_equal(t[0].probe_from(t[0].impl, 1, dsgd_now() + 5, &tag, &bytes, &gone), DSGD_OK);
    assert_true(tag == 9 && gone == 0);
    assert_int_equal(t[0].recv(t[0].impl, 1, 9, &v, sizeof(v), dsgd_now() + 5), DSGD_OK);
    t_start = dsgd_now();
    assert_int_equal(t[0].probe_from(t[0].impl, 1, t_start + 0.1, &tag, &bytes, &gone), DSGD_ERR_TIMEOUT);
    assert_true(dsgd_now() - t_start >= 0.1 && gone == 0);
    assert_non_null(strstr(t[0].error_message(t[0].impl), "deadline passed while waiting for a message from rank 1"));
    assert_int_equal(t[0].probe_from(t[0].impl, 0, t_start + 1, &tag, &bytes, &gone), DSGD_ERR_INVALID_ARGUMENT);
    dsgd_loopback_destroy(hub);
    dsgd_ctx_destroy(ctx);
    tu_watchdog(0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_probe_any_source),
        cmocka_unit_test(test_probe_from),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
