/*
 * send: `converger send --url HTTP_URL --api-key K --conv C --sender U
 * [--idempotency-key K] [--retries N] [--timeout-ms MS] BODY_JSON` appends
 * one message over REST (POST {url}/v1/conversations/{conv}/messages) and
 * prints the answer {"seq":N,"id":"..."} on stdout.
 *
 * A 503 (the node is busy, starting or draining) is retried after the
 * node's hint; a connection failure (the node is restarting) after a
 * jittered backoff. Every attempt carries the same Idempotency-Key (a
 * random UUID when none is given), so the message is stored once however
 * often it is retried. Main thread; blocks.
 */
#ifndef CONVERGER_CLI_SEND_H
#define CONVERGER_CLI_SEND_H

/* argv excludes "send". Returns the exit status: 0 sent, 1 failed (an HTTP
 * error, a bad answer or retries used up), 2 bad usage. */
int send_main(int argc, char **argv);

#endif
