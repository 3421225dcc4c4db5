"""The front's framing (fleet/server/front.py ``Reading``): where a request ends, however its bytes
arrive, and what is refused before any thread or parser sees it."""
from __future__ import annotations

import pytest

from fleet.server.front import FRONT_CODES, FrontLimits, Reading, Refused
from gateway.errors import CODES

LIMITS = FrontLimits(head_timeout_s=10, body_timeout_s=30, max_head_bytes=4096, max_body_bytes=1000,
                     max_connections=100, max_reading_per_client=10)


def fed(data: bytes, piece: int | None = None) -> int | None:
    """The length of the whole request once ``data`` has arrived (in pieces of ``piece``)."""
    reading = Reading(LIMITS, "c", 0.0)
    end = None
    step = piece or len(data) or 1
    for at in range(0, len(data), step):
        end = reading.feed(data[at:at + step])
        if end is not None:
            return end
    return end


def refused(data: bytes) -> Refused:
    with pytest.raises(Refused) as caught:
        fed(data)
    return caught.value


GET = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
CHUNKED = (b"POST /execute_sql HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
           b"5\r\nhello\r\n6;name=value\r\n world\r\n0\r\nX-Trailer: 1\r\n\r\n")


def test_the_front_codes_are_the_gateways_public_codes():
    assert {code: CODES[code][0] for code in FRONT_CODES} == FRONT_CODES


@pytest.mark.parametrize("piece", [None, 1, 2, 7])
def test_a_request_ends_where_its_framing_says_however_it_arrives(piece):
    assert fed(GET, piece) == len(GET)
    assert fed(GET + b"GET / HTTP/1.1\r\n", piece) == len(GET)          # the next one's start is not this one's
    body = b"POST /q/x HTTP/1.1\r\nContent-Length: 4\r\n\r\nabcd"
    assert fed(body, piece) == len(body)
    assert fed(body[:-1], piece) is None
    assert fed(CHUNKED, piece) == len(CHUNKED)
    assert fed(CHUNKED[:-2], piece) is None
    assert fed(CHUNKED + GET, piece) == len(CHUNKED)


def test_a_head_not_yet_whole_waits():
    assert fed(b"GET / HTTP/1.1\r\nHost: x\r\n") is None
    assert fed(b"POST /q/x HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc") is None


@pytest.mark.parametrize("data, why", [
    (b"GET / HTTP/1.1\nHost: x\n\n", "bare LF in the head"),
    (b"GET / HTTP/1.1\r\nHost: x\n\r\n\r\n", "bare LF inside a field"),
    (b"GET / HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n", "obs-fold"),
    (b"GET / HTTP/1.1\r\nHost : x\r\n\r\n", "space before the colon"),
    (b"POST / HTTP/1.1\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n", "CL + TE"),
    (b"POST / HTTP/1.1\r\nContent-Length: 4\r\nContent-Length: 4\r\n\r\nabcd", "two Content-Length"),
    (b"POST / HTTP/1.1\r\nContent-Length: +4\r\n\r\nabcd", "a signed length"),
    (b"POST / HTTP/1.1\r\nContent-Length: 4, 4\r\n\r\nabcd", "a list as length"),
    (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked, identity\r\n\r\n", "TE not ending in chunked"),
    (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n", "bad chunk size"),
    (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\nhello\r\n0\r\n\r\n", "negative chunk size"),
    (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5;a\nb\r\nhello\r\n0\r\n\r\n", "bare LF in an extension"),
    (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5;a\rb\r\nhello\r\n0\r\n\r\n", "bare CR in an extension"),
    (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n", "bare LF after a size"),
    (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXY0\r\n\r\n", "data not followed by CRLF"),
])
def test_malformed_framing_is_a_400(data, why):
    refusal = refused(data)
    assert (refusal.status, refusal.code) == (400, "malformed_request"), why


def test_what_is_too_large_is_refused_before_it_arrives():
    assert refused(b"POST / HTTP/1.1\r\nContent-Length: 1001\r\n\r\n").code == "payload_too_large"
    assert refused(b"GET / HTTP/1.1\r\nX: " + b"a" * 5000).code == "headers_too_large"      # no end in sight
    chunks = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" + b"1f4\r\n" + b"a" * 500 + b"\r\n" + b"1f5\r\n"
    assert refused(chunks).code == "payload_too_large"
    assert refused(b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n").status == 501


def test_an_expectation_of_100_continue_is_noted_only_for_a_body():
    reading = Reading(LIMITS, "c", 0.0)
    assert reading.feed(b"POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n") is None
    assert reading.expects_continue and reading.waiting_for_body
    empty = Reading(LIMITS, "c", 0.0)
    assert empty.feed(b"POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 0\r\n\r\n") is not None
    assert not empty.expects_continue


def test_the_refusal_is_one_closing_response_with_the_gateways_error_body():
    import orjson

    answer = refused(b"GET / HTTP/1.1\nHost: x\n\n").response()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 Bad Request\r\n") and b"\r\nConnection: close" in head
    assert int(head.split(b"Content-Length: ")[1]) == len(body)
    assert orjson.loads(body)["code"] == "malformed_request"


def test_the_servers_arrival_stamp_is_the_one_the_application_reads():
    """fleet/server/worker.py keeps its own copy (the master must not load the application)."""
    from fleet.server import worker
    from gateway.http import common

    assert worker.ARRIVED == common.ARRIVED


@pytest.mark.parametrize("data, plain", [
    (GET, True),
    (GET + b"G", False),                                                         # more behind it
    (GET[:-2], False),                                                           # not whole
    (b"POST /q/x HTTP/1.1\r\ncontent-LENGTH: 0\r\n\r\n", False),                 # a body's framing, any case
    (b"POST /q/x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", False),
    (b"GET / HTTP/1.1\r\nHost: x\nX: y\r\n\r\n", False),                         # a bare LF
    (b"GET / HTTP/1.1\r\nX: " + b"a" * 5000 + b"\r\n\r\n", False),               # over the head's cap
])
def test_the_usual_get_is_recognised_without_a_reading(data, plain):
    """``lone_plain_head``'s yes must be the ``Reading``'s: one whole request, nothing behind it."""
    from fleet.server.front import lone_plain_head

    assert lone_plain_head(data, LIMITS.max_head_bytes) is plain
    if plain:
        assert fed(data) == len(data)
