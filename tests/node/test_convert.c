/* Conversions of src/node/convert.c that need no network: state machine
 * results to the CommandResult of a client reply, memberships to and from
 * ClusterConfig. */
#include <criterion/criterion.h>
#include <string.h>

#include "fsm/fsm.h"
#include "idalloc_errors.h"
#include "src/node/convert.h"

/* Pack @pb->msg and unpack it again with protobuf-c (caller frees). */
static Idalloc__CommandResult *roundtrip(const struct ida_fsm_result_pb *pb)
{
    uint8_t buf[128];
    size_t n = idalloc__command_result__get_packed_size(&pb->msg);
    cr_assert_leq(n, sizeof(buf));
    idalloc__command_result__pack(&pb->msg, buf);
    Idalloc__CommandResult *m = idalloc__command_result__unpack(NULL, n, buf);
    cr_assert_not_null(m);
    return m;
}

Test(convert, result_to_pb_roundtrips_through_protobuf)
{
    struct ida_fsm_result r;
    memset(&r, 0, sizeof(r));
    r.error_msg = "";
    r.op = IDA_FSM_OP_PREFIX_ALLOC;
    r.prefix_len = 2;
    r.prefix[0] = 1;
    r.prefix[1] = 0x2a;
    struct ida_fsm_result_pb pb;
    ida_fsm_result_to_pb(&r, &pb);
    Idalloc__CommandResult *m = roundtrip(&pb);
    cr_assert_eq(m->error, 0);
    cr_assert_eq(m->result_case, IDALLOC__COMMAND_RESULT__RESULT_PREFIX_ALLOC);
    cr_assert_eq(m->prefix_alloc->prefix.len, r.prefix_len);
    cr_assert_eq(memcmp(m->prefix_alloc->prefix.data, r.prefix, r.prefix_len),
                 0);
    idalloc__command_result__free_unpacked(m, NULL);

    memset(&r, 0, sizeof(r));
    r.error = IDA_ENOPOOL;
    r.error_msg = "no pool with this name";
    ida_fsm_result_to_pb(&r, &pb);
    m = roundtrip(&pb);
    cr_assert_eq(m->error, IDA_ENOPOOL);
    cr_assert_str_eq(m->error_msg, r.error_msg);
    cr_assert_eq(m->result_case, IDALLOC__COMMAND_RESULT__RESULT__NOT_SET);
    idalloc__command_result__free_unpacked(m, NULL);
}

/* The operator's removal record travels with the membership
 * (ClusterConfig.removed, src/node/member.h) and is checked like the
 * members: a removed id that is also a member, or listed twice, is
 * malformed. */
Test(convert, membership_removed_record_round_trips_and_is_checked)
{
    struct ida_raft_conf c = {.n = 2};
    c.voters[0] = 1;
    c.voter_inc[0] = 11;
    c.voters[1] = 2;
    c.voter_inc[1] = 22;
    c.n_learners = 1;
    c.learners[0] = 4;
    c.learner_inc[0] = 44;
    c.n_removed = 2;
    c.removed[0] = 3;
    c.removed_inc[0] = 33;
    c.removed[1] = 5;
    c.removed_inc[1] = 55;
    uint8_t buf[512];
    size_t len;
    cr_assert_eq(node_conf_encode(&c, buf, sizeof(buf), &len), 0);
    struct ida_raft_conf d;
    memset(&d, 0xAB, sizeof(d));
    cr_assert_eq(node_conf_decode(buf, len, &d), 0);
    cr_assert_eq(d.n, 2);
    cr_assert_eq(d.n_learners, 1);
    cr_assert_eq(d.n_removed, 2);
    cr_assert_eq(d.removed[0], 3);
    cr_assert_eq(d.removed_inc[0], 33);
    cr_assert_eq(d.removed[1], 5);
    cr_assert_eq(d.removed_inc[1], 55);
    cr_assert_eq(node_conf_removed_slot(&d, 5), 1);
    cr_assert_eq(node_conf_removed_slot(&d, 1), -1);

    /* Without a record (every membership written before it existed). */
    c.n_removed = 0;
    cr_assert_eq(node_conf_encode(&c, buf, sizeof(buf), &len), 0);
    cr_assert_eq(node_conf_decode(buf, len, &d), 0);
    cr_assert_eq(d.n_removed, 0);

    /* A removed id that is a member, or one listed twice: refused, and
     * the output is untouched. */
    struct ida_raft_conf before = d;
    c.n_removed = 1;
    c.removed[0] = 4; /* the learner */
    cr_assert_eq(node_conf_encode(&c, buf, sizeof(buf), &len), 0);
    cr_assert_eq(node_conf_decode(buf, len, &d), IDA_EPROTO);
    c.n_removed = 2;
    c.removed[0] = 3;
    c.removed[1] = 3;
    cr_assert_eq(node_conf_encode(&c, buf, sizeof(buf), &len), 0);
    cr_assert_eq(node_conf_decode(buf, len, &d), IDA_EPROTO);
    cr_assert_eq(memcmp(&before, &d, sizeof(d)), 0);
}

/* The node's door: a forged request whose tag or pool name holds a NUL
 * byte, or whose tag is not UTF-8, is refused with the rule it broke before
 * anything of it reaches the log; valid ones and nameless ones pass. */
Test(convert, request_check_refuses_bad_names_at_the_door)
{
    Idalloc__ClientRequest req = IDALLOC__CLIENT_REQUEST__INIT;
    Idalloc__Alloc a = IDALLOC__ALLOC__INIT;
    req.op_case = IDALLOC__CLIENT_REQUEST__OP_ALLOC;
    req.alloc = &a;
    a.pool = (ProtobufCBinaryData){1, (uint8_t *)"b"};
    a.tag = (ProtobufCBinaryData){5, (uint8_t *)"alice"};
    const char *why = NULL;
    cr_assert_eq(node_request_check(&req, &why), 0);
    cr_assert_null(why, "left alone: the node's later errors say their own");
    a.tag = (ProtobufCBinaryData){10, (uint8_t *)"alice\0evil"};
    cr_assert_eq(node_request_check(&req, &why), IDA_EINVAL);
    cr_assert_str_eq(why, "tag holds a NUL byte");
    a.tag = (ProtobufCBinaryData){2, (uint8_t *)"\xff\xfe"};
    cr_assert_eq(node_request_check(&req, &why), IDA_EINVAL);
    cr_assert_str_eq(why, "tag is not valid UTF-8");
    a.tag = (ProtobufCBinaryData){5, (uint8_t *)"alice"};
    a.pool = (ProtobufCBinaryData){3, (uint8_t *)"b\0q"};
    cr_assert_eq(node_request_check(&req, &why), IDA_EINVAL);
    cr_assert(strstr(why, "pool name") != NULL);
    Idalloc__PoolCreate pc = IDALLOC__POOL_CREATE__INIT;
    pc.name = (ProtobufCBinaryData){3, (uint8_t *)"p\0q"};
    req.op_case = IDALLOC__CLIENT_REQUEST__OP_POOL_CREATE;
    req.pool_create = &pc;
    cr_assert_eq(node_request_check(&req, &why), IDA_EINVAL);
    Idalloc__Status st = IDALLOC__STATUS__INIT;
    req.op_case = IDALLOC__CLIENT_REQUEST__OP_STATUS;
    req.status = &st;
    cr_assert_eq(node_request_check(&req, &why), 0);
}
