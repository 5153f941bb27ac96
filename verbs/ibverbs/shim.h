// Copyright rdmacp authors. C shims for the ibverbs provider.
//
// libibverbs' data-path calls (ibv_post_send, ibv_post_recv, ibv_poll_cq,
// ibv_req_notify_cq, ibv_alloc_mw ...) are static inline functions or
// macros in verbs.h. These shims turn one batch of plain-data requests,
// written by Go into C memory, into one call: Go never hands C a Go
// pointer that C keeps, and every list C builds lives in C memory.
//
// Only included by files built with the rdma tag.

#ifndef RDMACP_IBVERBS_SHIM_H
#define RDMACP_IBVERBS_SHIM_H

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

// A send work request as Go writes it.
struct rc_swr {
	uint64_t wr_id;
	uint64_t laddr;
	uint32_t llen;
	uint32_t lkey;
	uint64_t raddr;
	uint32_t rkey;   // READ/WRITE: remote key; LOCAL_INV: key to invalidate; BIND_MW: new key
	uint32_t opcode; // enum ibv_wr_opcode
	uint32_t access; // BIND_MW: window access flags
	uint32_t nsge;   // 0 or 1
	struct ibv_mw *mw;
	struct ibv_mr *mr;
	uint64_t baddr;
	uint64_t blen;
};

// A receive work request as Go writes it.
struct rc_rwr {
	uint64_t wr_id;
	uint64_t addr;
	uint32_t len;
	uint32_t lkey;
};

// A completion as Go reads it.
struct rc_wc {
	uint64_t wr_id;
	uint32_t status;
	uint32_t opcode;
	uint32_t byte_len;
	uint32_t qp_num;
	uint32_t vendor_err;
	uint32_t pad;
};

// Chain n requests in C scratch memory and post them with one
// ibv_post_send. Returns how many were posted; *err is 0 or the errno
// that refused in[ret].
static int rc_post_send(struct ibv_qp *qp, const struct rc_swr *in, int n,
			struct ibv_send_wr *wr, struct ibv_sge *sge, int *err)
{
	int i;
	struct ibv_send_wr *bad = NULL;

	if (n <= 0) {
		*err = 0;
		return 0;
	}
	memset(wr, 0, (size_t)n * sizeof(*wr));
	for (i = 0; i < n; i++) {
		const struct rc_swr *s = &in[i];
		struct ibv_send_wr *w = &wr[i];

		w->wr_id = s->wr_id;
		w->next = i + 1 < n ? &wr[i + 1] : NULL;
		w->opcode = (enum ibv_wr_opcode)s->opcode;
		w->send_flags = IBV_SEND_SIGNALED;
		sge[i].addr = s->laddr;
		sge[i].length = s->llen;
		sge[i].lkey = s->lkey;
		w->sg_list = &sge[i];
		w->num_sge = (int)s->nsge;
		switch (s->opcode) {
		case IBV_WR_RDMA_READ:
		case IBV_WR_RDMA_WRITE:
			w->wr.rdma.remote_addr = s->raddr;
			w->wr.rdma.rkey = s->rkey;
			break;
		case IBV_WR_LOCAL_INV:
			w->num_sge = 0;
			w->invalidate_rkey = s->rkey;
			break;
		case IBV_WR_BIND_MW:
			w->num_sge = 0;
			w->bind_mw.mw = s->mw;
			w->bind_mw.rkey = s->rkey;
			w->bind_mw.bind_info.mr = s->mr;
			w->bind_mw.bind_info.addr = s->baddr;
			w->bind_mw.bind_info.length = s->blen;
			w->bind_mw.bind_info.mw_access_flags = s->access;
			break;
		default:
			break;
		}
	}
	int rc = ibv_post_send(qp, wr, &bad);
	if (rc == 0) {
		*err = 0;
		return n;
	}
	*err = rc < 0 ? -rc : rc;
	if (bad == NULL || bad < wr || bad >= wr + n)
		return 0;
	return (int)(bad - wr);
}

static int rc_post_recv(struct ibv_qp *qp, const struct rc_rwr *in, int n,
			struct ibv_recv_wr *wr, struct ibv_sge *sge, int *err)
{
	int i;
	struct ibv_recv_wr *bad = NULL;

	if (n <= 0) {
		*err = 0;
		return 0;
	}
	for (i = 0; i < n; i++) {
		wr[i].wr_id = in[i].wr_id;
		wr[i].next = i + 1 < n ? &wr[i + 1] : NULL;
		sge[i].addr = in[i].addr;
		sge[i].length = in[i].len;
		sge[i].lkey = in[i].lkey;
		wr[i].sg_list = &sge[i];
		wr[i].num_sge = in[i].len > 0 ? 1 : 0;
	}
	int rc = ibv_post_recv(qp, wr, &bad);
	if (rc == 0) {
		*err = 0;
		return n;
	}
	*err = rc < 0 ? -rc : rc;
	if (bad == NULL || bad < wr || bad >= wr + n)
		return 0;
	return (int)(bad - wr);
}

// Poll up to n completions into out. Returns the count, or -errno.
static int rc_poll(struct ibv_cq *cq, struct ibv_wc *wc, struct rc_wc *out, int n)
{
	int i, got = ibv_poll_cq(cq, n, wc);
	if (got < 0)
		return got < -1 ? got : -EIO;
	for (i = 0; i < got; i++) {
		out[i].wr_id = wc[i].wr_id;
		out[i].status = wc[i].status;
		out[i].opcode = wc[i].opcode;
		out[i].byte_len = wc[i].byte_len;
		out[i].qp_num = wc[i].qp_num;
		out[i].vendor_err = wc[i].vendor_err;
		out[i].pad = 0;
	}
	return got;
}

static int rc_req_notify(struct ibv_cq *cq)
{
	int rc = ibv_req_notify_cq(cq, 0);
	return rc < 0 ? -rc : rc;
}

// Take every pending event off a non-blocking completion channel.
// Returns how many were taken (each must be acked), or -errno when none
// was and the error is not EAGAIN.
static int rc_get_cq_events(struct ibv_comp_channel *ch)
{
	int n = 0;
	for (;;) {
		struct ibv_cq *cq;
		void *ctx;
		if (ibv_get_cq_event(ch, &cq, &ctx) != 0) {
			if (n == 0 && errno != EAGAIN && errno != EWOULDBLOCK)
				return -errno;
			return n;
		}
		n++;
	}
}

static int rc_set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return errno;
	return 0;
}

static struct ibv_mr *rc_reg_mr(struct ibv_pd *pd, uintptr_t addr, size_t len, int access, int *err)
{
	errno = 0;
	struct ibv_mr *mr = ibv_reg_mr(pd, (void *)addr, len, access);
	*err = mr ? 0 : (errno ? errno : EINVAL);
	return mr;
}

static struct ibv_mw *rc_alloc_mw(struct ibv_pd *pd, int *err)
{
	errno = 0;
	struct ibv_mw *mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
	*err = mw ? 0 : (errno ? errno : EOPNOTSUPP);
	return mw;
}

static int rc_dealloc_mw(struct ibv_mw *mw) { return ibv_dealloc_mw(mw); }
static uint32_t rc_mw_rkey(struct ibv_mw *mw) { return mw->rkey; }
static void rc_mw_set_rkey(struct ibv_mw *mw, uint32_t k) { mw->rkey = k; }
static uint32_t rc_inc_rkey(uint32_t k) { return ibv_inc_rkey(k); }

static int rc_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *pa)
{
	return ibv_query_port(ctx, port, pa);
}

// One GID table entry: 0 and its type, or an errno (e.g. ENODATA for an
// empty slot).
static int rc_query_gid(struct ibv_context *ctx, uint32_t port, uint32_t idx,
			uint8_t raw[16], uint32_t *type)
{
	struct ibv_gid_entry e;
	int rc = ibv_query_gid_ex(ctx, port, idx, &e, 0);
	if (rc != 0) {
		// Older kernels: fall back to the plain query, type unknown.
		union ibv_gid g;
		if (ibv_query_gid(ctx, (uint8_t)port, (int)idx, &g) != 0)
			return rc;
		memcpy(raw, g.raw, 16);
		*type = 0xff;
		return 0;
	}
	memcpy(raw, e.gid.raw, 16);
	*type = e.gid_type;
	return 0;
}

// An rdma_cm event copied out of librdmacm's buffer; the event itself is
// acked before Go sees this, so no destroy ever waits on Go.
struct rc_cm_event {
	struct rdma_cm_id *id;
	uint64_t token;        // the id's, which Go gave it (rc_create_id, rc_set_token)
	uint64_t listen_token; // CONNECT_REQUEST: the listening id's
	int32_t event;
	int32_t status;
	uint32_t qp_num;
	uint8_t responder_resources;
	uint8_t initiator_depth;
	uint8_t private_len;
	uint8_t pad;
	uint8_t private_data[256];
};

// Returns 0 with *out filled, EAGAIN when there is no event, or an errno.
static int rc_get_cm_event(struct rdma_event_channel *ch, struct rc_cm_event *out)
{
	struct rdma_cm_event *ev = NULL;
	if (rdma_get_cm_event(ch, &ev) != 0)
		return errno ? errno : EIO;
	memset(out, 0, sizeof(*out));
	out->id = ev->id;
	out->token = (uint64_t)(uintptr_t)ev->id->context;
	out->listen_token = ev->listen_id ? (uint64_t)(uintptr_t)ev->listen_id->context : 0;
	out->event = ev->event;
	out->status = ev->status;
	if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST ||
	    ev->event == RDMA_CM_EVENT_ESTABLISHED ||
	    ev->event == RDMA_CM_EVENT_REJECTED ||
	    ev->event == RDMA_CM_EVENT_CONNECT_RESPONSE) {
		out->qp_num = ev->param.conn.qp_num;
		out->responder_resources = ev->param.conn.responder_resources;
		out->initiator_depth = ev->param.conn.initiator_depth;
		if (ev->param.conn.private_data && ev->param.conn.private_data_len) {
			size_t n = ev->param.conn.private_data_len;
			if (n > sizeof(out->private_data))
				n = sizeof(out->private_data);
			memcpy(out->private_data, ev->param.conn.private_data, n);
			out->private_len = (uint8_t)(n > 255 ? 255 : n);
		}
	}
	rdma_ack_cm_event(ev);
	return 0;
}

// rdma_cm ids carry a token in their context, never reused, which events
// are routed by: an id's address may be reused as soon as it is
// destroyed, and an event read just before that must not reach the id
// allocated next at the same address.
static int rc_create_id(struct rdma_event_channel *ch, uint64_t token, struct rdma_cm_id **id)
{
	if (rdma_create_id(ch, id, (void *)(uintptr_t)token, RDMA_PS_TCP) != 0)
		return errno ? errno : EINVAL;
	return 0;
}

static void rc_set_token(struct rdma_cm_id *id, uint64_t token) { id->context = (void *)(uintptr_t)token; }

// An async event, copied and acked.
struct rc_async_event {
	int32_t type;
	int32_t port;
	uintptr_t element; // ibv_qp*, ibv_cq* ... by type
};

static int rc_get_async_event(struct ibv_context *ctx, struct rc_async_event *out)
{
	struct ibv_async_event ev;
	if (ibv_get_async_event(ctx, &ev) != 0)
		return errno ? errno : EIO;
	out->type = ev.event_type;
	out->port = 0;
	out->element = 0;
	switch (ev.event_type) {
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_COMM_EST:
	case IBV_EVENT_SQ_DRAINED:
	case IBV_EVENT_PATH_MIG:
	case IBV_EVENT_PATH_MIG_ERR:
	case IBV_EVENT_QP_LAST_WQE_REACHED:
		out->element = (uintptr_t)ev.element.qp;
		break;
	case IBV_EVENT_CQ_ERR:
		out->element = (uintptr_t)ev.element.cq;
		break;
	case IBV_EVENT_PORT_ACTIVE:
	case IBV_EVENT_PORT_ERR:
	case IBV_EVENT_LID_CHANGE:
	case IBV_EVENT_PKEY_CHANGE:
	case IBV_EVENT_SM_CHANGE:
	case IBV_EVENT_CLIENT_REREGISTER:
	case IBV_EVENT_GID_CHANGE:
		out->port = ev.element.port_num;
		break;
	default:
		break;
	}
	ibv_ack_async_event(&ev);
	return 0;
}

// sockaddr <-> plain bytes.
static void rc_sockaddr_get(const struct sockaddr *sa, int *family, uint8_t ip[16], uint16_t *port)
{
	*family = sa->sa_family;
	memset(ip, 0, 16);
	*port = 0;
	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *s = (const struct sockaddr_in *)sa;
		memcpy(ip, &s->sin_addr, 4);
		*port = ntohs(s->sin_port);
	} else if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)sa;
		memcpy(ip, &s->sin6_addr, 16);
		*port = ntohs(s->sin6_port);
	}
}

static void rc_sockaddr_set(struct sockaddr_storage *ss, int v6, const uint8_t ip[16], uint16_t port, uint32_t zone)
{
	memset(ss, 0, sizeof(*ss));
	if (v6) {
		struct sockaddr_in6 *s = (struct sockaddr_in6 *)ss;
		s->sin6_family = AF_INET6;
		memcpy(&s->sin6_addr, ip, 16);
		s->sin6_port = htons(port);
		s->sin6_scope_id = zone;
	} else {
		struct sockaddr_in *s = (struct sockaddr_in *)ss;
		s->sin_family = AF_INET;
		memcpy(&s->sin_addr, ip, 4);
		s->sin_port = htons(port);
	}
}

static void rc_id_addrs(struct rdma_cm_id *id, int *lf, uint8_t lip[16], uint16_t *lport,
			int *rf, uint8_t rip[16], uint16_t *rport)
{
	rc_sockaddr_get(rdma_get_local_addr(id), lf, lip, lport);
	rc_sockaddr_get(rdma_get_peer_addr(id), rf, rip, rport);
}

// Negotiated READ depths and path MTU of a connected QP.
static int rc_query_qp_rd(struct ibv_qp *qp, int *ord, int *ird, int *mtu, int *state)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;
	memset(&a, 0, sizeof(a));
	int rc = ibv_query_qp(qp, &a, IBV_QP_STATE | IBV_QP_MAX_QP_RD_ATOMIC |
				 IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_PATH_MTU, &ia);
	if (rc != 0)
		return rc;
	*ord = a.max_rd_atomic;
	*ird = a.max_dest_rd_atomic;
	*mtu = a.path_mtu;
	*state = a.qp_state;
	return 0;
}

static int rc_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_cq *scq,
			struct ibv_cq *rcq, uint32_t max_send, uint32_t max_recv)
{
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof(a));
	a.send_cq = scq;
	a.recv_cq = rcq;
	a.qp_type = IBV_QPT_RC;
	a.sq_sig_all = 1;
	a.cap.max_send_wr = max_send;
	a.cap.max_recv_wr = max_recv;
	a.cap.max_send_sge = 1;
	a.cap.max_recv_sge = 1;
	if (rdma_create_qp(id, pd, &a) != 0)
		return errno ? errno : EINVAL;
	return 0;
}

static int rc_connect(struct rdma_cm_id *id, const void *pd, uint8_t pdlen,
		      uint8_t resp_res, uint8_t init_depth, int accept)
{
	struct rdma_conn_param p;
	memset(&p, 0, sizeof(p));
	p.private_data = pdlen ? pd : NULL;
	p.private_data_len = pdlen;
	p.responder_resources = resp_res;
	p.initiator_depth = init_depth;
	p.retry_count = 7;
	p.rnr_retry_count = 7;
	int rc = accept ? rdma_accept(id, &p) : rdma_connect(id, &p);
	if (rc != 0)
		return errno ? errno : EINVAL;
	return 0;
}

static int rc_errno_call(int rc) { return rc == 0 ? 0 : (errno ? errno : EINVAL); }

static const char *rc_device_name(struct ibv_context *ctx) { return ibv_get_device_name(ctx->device); }
static int rc_transport(struct ibv_context *ctx) { return ctx->device->transport_type; }
static int rc_async_fd(struct ibv_context *ctx) { return ctx->async_fd; }
static struct ibv_qp *rc_id_qp(struct rdma_cm_id *id) { return id->qp; }
static struct ibv_context *rc_id_verbs(struct rdma_cm_id *id) { return id->verbs; }
static uint8_t rc_id_port(struct rdma_cm_id *id) { return id->port_num; }

// Out-of-band setup (oob.go): the QP is created and moved through INIT,
// RTR and RTS by hand, as perftest does without -R. The attribute values
// are rdma_cm's for RC: retry 7, RNR retry 7, local ACK timeout 14
// (4.096 us x 2^14, 67 ms), RNR timer 12 (0.64 ms).
static struct ibv_qp *rc_create_qp_oob(struct ibv_pd *pd, struct ibv_cq *scq, struct ibv_cq *rcq,
				       uint32_t max_send, uint32_t max_recv, uint8_t port, int *err)
{
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof(a));
	a.send_cq = scq;
	a.recv_cq = rcq;
	a.qp_type = IBV_QPT_RC;
	a.sq_sig_all = 1;
	a.cap.max_send_wr = max_send;
	a.cap.max_recv_wr = max_recv;
	a.cap.max_send_sge = 1;
	a.cap.max_recv_sge = 1;
	struct ibv_qp *qp = ibv_create_qp(pd, &a);
	if (qp == NULL) {
		*err = errno ? errno : EINVAL;
		return NULL;
	}
	struct ibv_qp_attr m;
	memset(&m, 0, sizeof(m));
	m.qp_state = IBV_QPS_INIT;
	m.pkey_index = 0;
	m.port_num = port;
	m.qp_access_flags = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
	int rc = ibv_modify_qp(qp, &m, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
	if (rc != 0) {
		*err = rc;
		ibv_destroy_qp(qp);
		return NULL;
	}
	return qp;
}

// rc_qp_rtr_rts moves an INIT QP to RTR towards the peer (dgid, an
// IPv4-mapped RoCE v2 GID; dqpn; its first PSN rpsn) and on to RTS.
// It returns 1 or 2 with *err set when the RTR or the RTS step fails.
static int rc_qp_rtr_rts(struct ibv_qp *qp, uint8_t port, int sgid, const uint8_t dgid[16],
			 uint32_t dqpn, uint32_t rpsn, uint32_t spsn, int mtu, uint8_t ird, uint8_t ord, int *err)
{
	struct ibv_qp_attr m;
	memset(&m, 0, sizeof(m));
	m.qp_state = IBV_QPS_RTR;
	m.path_mtu = (enum ibv_mtu)mtu;
	m.dest_qp_num = dqpn;
	m.rq_psn = rpsn;
	m.max_dest_rd_atomic = ird;
	m.min_rnr_timer = 12;
	m.ah_attr.is_global = 1;
	memcpy(m.ah_attr.grh.dgid.raw, dgid, 16);
	m.ah_attr.grh.sgid_index = sgid;
	m.ah_attr.grh.hop_limit = 64;
	m.ah_attr.port_num = port;
	int rc = ibv_modify_qp(qp, &m, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				       IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
	if (rc != 0) {
		*err = rc;
		return 1;
	}
	memset(&m, 0, sizeof(m));
	m.qp_state = IBV_QPS_RTS;
	m.timeout = 14;
	m.retry_cnt = 7;
	m.rnr_retry = 7;
	m.sq_psn = spsn;
	m.max_rd_atomic = ord;
	rc = ibv_modify_qp(qp, &m, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				       IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
	if (rc != 0) {
		*err = rc;
		return 2;
	}
	return 0;
}

// rc_qp_to_err moves a QP to ERR, which flushes what is outstanding:
// the out-of-band setup's disconnect (rdma_disconnect does it for
// rdma_cm QPs).
static int rc_qp_to_err(struct ibv_qp *qp)
{
	struct ibv_qp_attr m;
	memset(&m, 0, sizeof(m));
	m.qp_state = IBV_QPS_ERR;
	return ibv_modify_qp(qp, &m, IBV_QP_STATE);
}

#endif
