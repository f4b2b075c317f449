/* The address book (src/node/book.h) and memberships with addresses
 * (src/node/convert.h). */
#include <criterion/criterion.h>
#include <string.h>

#include "base/heap.h"
#include "idalloc_errors.h"
#include "src/node/book.h"
#include "src/node/convert.h"

static struct ida_config file;

static void load_file(void)
{
    const char *text =
        "cluster t\npeer_tls off\n"
        "node 1 127.0.0.1:7101 127.0.0.1:7201\n"
        "node 2 127.0.0.1:7102 127.0.0.1:7202\n"
        "node 3 127.0.0.1:7103 127.0.0.1:7203\n";
    char err[IDA_ERRMSG_MAX];
    cr_assert_eq(ida_config_parse(text, strlen(text), "t", &file, err), 0, "%s",
                 err);
}

static struct ida_addr addr(const char *s)
{
    struct ida_addr a;
    cr_assert_eq(ida_addr_parse(s, &a), 0, "%s", s);
    return a;
}

/* The membership {1, 3 voters; 4 learner}: node 3 moved, node 4 is not in
 * the file, node 1 written without addresses. */
static void encode(uint8_t **buf, size_t *len)
{
    struct ida_raft_conf c = {.n = 2, .n_learners = 1};
    c.voters[0] = 1;
    c.voters[1] = 3;
    c.learners[0] = 4;
    struct node_book b = {.n = 0};
    struct ida_addr p3 = addr("127.0.0.1:8103"), c3 = addr("127.0.0.1:8203");
    struct ida_addr p4 = addr("[::1]:8104"), c4 = addr("[::1]:8204");
    cr_assert_eq(node_book_set(&b, 3, true, &p3, &c3), 0);
    cr_assert_eq(node_book_set(&b, 4, true, &p4, &c4), 0);
    cr_assert_eq(node_conf_encode_full(&b, &c, buf, len), 0);
}

Test(book, members_at_the_membership_addresses_then_the_other_file_nodes)
{
    load_file();
    uint8_t *buf;
    size_t len;
    encode(&buf, &len);
    struct ida_raft_conf d;
    cr_assert_eq(node_conf_decode(buf, len, &d), 0, "addresses are skipped");
    cr_assert_eq(d.n, 2);
    cr_assert_eq(d.n_learners, 1);
    struct node_book b;
    cr_assert_eq(node_book_build(&b, buf, len, &file), 0);
    ida_free(buf);
    cr_assert_eq(b.n, 4, "1, 3, 4 members, 2 from the file");
    const struct node_book_entry *e = node_book_find(&b, 1);
    cr_assert(e != NULL && e->member);
    cr_assert_str_eq(e->peer.text, "127.0.0.1:7101", "no address: the file's");
    e = node_book_find(&b, 3);
    cr_assert(e != NULL && e->member);
    cr_assert_str_eq(e->peer.text, "127.0.0.1:8103", "moved: the membership's");
    cr_assert_str_eq(e->client.text, "127.0.0.1:8203");
    e = node_book_find(&b, 4);
    cr_assert(e != NULL && e->member);
    cr_assert_str_eq(e->client.text, "[::1]:8204");
    e = node_book_find(&b, 2);
    cr_assert(e != NULL && !e->member, "a file node that is not a member");
    cr_assert_null(node_book_find(&b, 5));
    struct ida_addr in_use = addr("[0::1]:8104");
    cr_assert_eq(node_book_addr_user(&b, &in_use, 0), 4, "same IPv6 address");
    cr_assert_eq(node_book_addr_user(&b, &in_use, 4), 0, "its own");
    struct ida_addr file2 = addr("127.0.0.1:7202");
    cr_assert_eq(node_book_addr_user(&b, &file2, 0), 0,
                 "non-members do not hold addresses");
}

/* A member at a file node's peer address: that file line is not dialled
 * (it would reach the member, whose certificate names another node). */
Test(book, a_file_line_at_a_members_address_is_left_out)
{
    load_file();
    struct ida_raft_conf c = {.n = 1};
    c.voters[0] = 6;
    struct node_book m = {.n = 0};
    struct ida_addr p = addr("127.0.0.1:7102"), cl = addr("127.0.0.1:9206");
    node_book_set(&m, 6, true, &p, &cl);
    uint8_t *buf;
    size_t len;
    cr_assert_eq(node_conf_encode_full(&m, &c, &buf, &len), 0);
    struct node_book b, again;
    cr_assert_eq(node_book_build(&b, buf, len, &file), 0);
    cr_assert_null(node_book_find(&b, 2));
    cr_assert_not_null(node_book_find(&b, 1));
    cr_assert_eq(b.n, 3);
    cr_assert_eq(node_book_build(&again, buf, len, &file), 0);
    cr_assert(node_book_equal(&b, &again));
    ida_free(buf);
    /* Garbage: the file's nodes alone, and an error. */
    uint8_t junk[3] = {0xff, 0xff, 0xff};
    cr_assert_eq(node_book_build(&b, junk, sizeof(junk), &file), IDA_EPROTO);
    cr_assert_eq(b.n, 3);
    cr_assert(!b.e[0].member);
    cr_assert_not(node_book_equal(&b, &again));
    /* No membership at all: the file. */
    cr_assert_eq(node_book_build(&b, NULL, 0, &file), 0);
    cr_assert_eq(b.n, 3);
}
