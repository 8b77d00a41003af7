"""The ``local`` limit store's SQL: its schema, the triggers that decide, and every statement it runs.

An admission, a settlement and a lease step are each one ``INSERT`` into a request table
(``admit``, ``settle``, ``lease``) whose trigger checks and records everything, then drops the
row (``RAISE(IGNORE)``); a refusal is ``RAISE(ABORT, 'limit:<n>')`` (``n``: the limit's place in
``LIMIT_NAMES``, from 1), which undoes the whole statement. :data:`SCHEMA_VERSION` is what
``PRAGMA user_version`` holds; an older file is upgraded in place (:mod:`.local`).
"""

from __future__ import annotations

from plugin_llm.limits.admission_rule import LEASE_SHARE
from plugin_llm.limits.settings import MAX_TOTAL

__all__ = [
    "SCHEMA_VERSION",
    "REQUEST_TABLES",
    "V3_COLUMNS",
    "SCHEMA",
    "ADMIT",
    "SETTLE",
    "SETTLE_MANY",
    "READ",
    "LEASE",
    "HELD",
    "PRUNE_MINUTES",
    "RESET",
    "FORGOTTEN",
    "BREAKER",
    "TAKE_PROBE",
    "PUT_BREAKER",
    "EVICT_BREAKER",
]

SCHEMA_VERSION = 5
#: the request tables hold no rows: a schema older than this version is upgraded by recreating them
REQUEST_TABLES = """
DROP TRIGGER IF EXISTS admit_request; DROP TABLE IF EXISTS admit;
DROP TRIGGER IF EXISTS settle_request; DROP TABLE IF EXISTS settle;
DROP TRIGGER IF EXISTS lease_request; DROP TABLE IF EXISTS lease;
"""
#: version 3 gave a reservation a number of calls in flight and of requests (a lease holds several);
#: version 4 saturates the usage counters at MAX_TOTAL (the triggers only: recreated);
#: version 5 adds the routes' circuit breakers (a table of their own)
V3_COLUMNS = """
ALTER TABLE reservations ADD COLUMN slots INTEGER NOT NULL DEFAULT 1;
ALTER TABLE reservations ADD COLUMN requests INTEGER NOT NULL DEFAULT 1;
"""

# Only calls in flight are rows of `reservations`, so a plugin's rows are found by the primary
# key's prefix with no second index (every index is one more page written per transaction).
# `admit` and `settle` never hold a row: their triggers act, then RAISE(IGNORE) the insert.
#: what the lease trigger decides against, from the plugin's rows: the other reservations in flight
#: (o_*: slots, and requests, tokens and nano-dollars in this minute, day and month) and the usage
#: already settled in the same windows (u_*); once for the check, once for the grant
_TOTALS = """FROM (SELECT COALESCE(SUM(slots), 0) AS o_slots,
          COALESCE(SUM(CASE WHEN minute = NEW.minute THEN requests END), 0) AS o_req,
          COALESCE(SUM(CASE WHEN minute = NEW.minute THEN tokens END), 0) AS o_tok,
          COALESCE(SUM(CASE WHEN day = NEW.day THEN nano END), 0) AS o_day,
          COALESCE(SUM(CASE WHEN month = NEW.month THEN nano END), 0) AS o_mon
     FROM reservations WHERE plugin = NEW.plugin AND id <> NEW.id),
    (SELECT COALESCE((SELECT requests FROM spend WHERE plugin = NEW.plugin AND bucket = 'min:' || NEW.minute), 0) AS u_req,
          COALESCE((SELECT tokens FROM spend WHERE plugin = NEW.plugin AND bucket = 'min:' || NEW.minute), 0) AS u_tok,
          COALESCE((SELECT nano FROM spend WHERE plugin = NEW.plugin AND bucket = 'day:' || NEW.day), 0) AS u_day,
          COALESCE((SELECT nano FROM spend WHERE plugin = NEW.plugin AND bucket = 'mon:' || NEW.month), 0) AS u_mon)"""

SCHEMA = """
CREATE TABLE IF NOT EXISTS spend (
    plugin TEXT NOT NULL, bucket TEXT NOT NULL,
    nano INTEGER NOT NULL DEFAULT 0, requests INTEGER NOT NULL DEFAULT 0, tokens INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (plugin, bucket)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS reservations (
    plugin TEXT NOT NULL, id TEXT NOT NULL, expires REAL NOT NULL,
    nano INTEGER NOT NULL, tokens INTEGER NOT NULL, minute TEXT NOT NULL, day TEXT NOT NULL, month TEXT NOT NULL,
    slots INTEGER NOT NULL DEFAULT 1, requests INTEGER NOT NULL DEFAULT 1,
    PRIMARY KEY (plugin, id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS breakers (
    route TEXT NOT NULL PRIMARY KEY, state TEXT NOT NULL, failures INTEGER NOT NULL,
    first_failure REAL, opened_at REAL, retry_at REAL, updated REAL NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS settle (plugin TEXT, id TEXT, nano INTEGER, tokens INTEGER, minute TEXT, day TEXT, month TEXT);
CREATE TABLE IF NOT EXISTS admit (
    plugin TEXT, id TEXT, expires REAL, nano INTEGER, tokens INTEGER, minute TEXT, day TEXT, month TEXT, now REAL,
    max_concurrent INTEGER, requests_per_minute INTEGER, tokens_per_minute INTEGER, budget_day INTEGER,
    budget_month INTEGER, settlements TEXT
);
CREATE TRIGGER IF NOT EXISTS admit_request BEFORE INSERT ON admit BEGIN
  INSERT INTO settle SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]'),
      json_extract(value, '$[3]'), json_extract(value, '$[4]'), json_extract(value, '$[5]'), json_extract(value, '$[6]')
    FROM json_each(NEW.settlements) WHERE NEW.settlements IS NOT NULL;
  DELETE FROM reservations WHERE plugin = NEW.plugin AND expires <= NEW.now;
  SELECT RAISE(ABORT, 'limit:1') WHERE NEW.max_concurrent IS NOT NULL
    AND (SELECT COALESCE(SUM(slots), 0) FROM reservations WHERE plugin = NEW.plugin) + 1 > NEW.max_concurrent;
  SELECT RAISE(ABORT, 'limit:2') WHERE NEW.requests_per_minute IS NOT NULL
    AND COALESCE((SELECT requests FROM spend WHERE plugin = NEW.plugin AND bucket = 'min:' || NEW.minute), 0)
      + (SELECT COALESCE(SUM(requests), 0) FROM reservations WHERE plugin = NEW.plugin AND minute = NEW.minute)
      + 1 > NEW.requests_per_minute;
  SELECT RAISE(ABORT, 'limit:3') WHERE NEW.tokens_per_minute IS NOT NULL
    AND COALESCE((SELECT tokens FROM spend WHERE plugin = NEW.plugin AND bucket = 'min:' || NEW.minute), 0)
      + (SELECT COALESCE(SUM(tokens), 0) FROM reservations WHERE plugin = NEW.plugin AND minute = NEW.minute)
      + NEW.tokens > NEW.tokens_per_minute;
  SELECT RAISE(ABORT, 'limit:4') WHERE NEW.budget_day IS NOT NULL
    AND COALESCE((SELECT nano FROM spend WHERE plugin = NEW.plugin AND bucket = 'day:' || NEW.day), 0)
      + (SELECT COALESCE(SUM(nano), 0) FROM reservations WHERE plugin = NEW.plugin AND day = NEW.day)
      + NEW.nano > NEW.budget_day;
  SELECT RAISE(ABORT, 'limit:5') WHERE NEW.budget_month IS NOT NULL
    AND COALESCE((SELECT nano FROM spend WHERE plugin = NEW.plugin AND bucket = 'mon:' || NEW.month), 0)
      + (SELECT COALESCE(SUM(nano), 0) FROM reservations WHERE plugin = NEW.plugin AND month = NEW.month)
      + NEW.nano > NEW.budget_month;
  INSERT INTO reservations (plugin, id, expires, nano, tokens, minute, day, month)
    VALUES (NEW.plugin, NEW.id, NEW.expires, NEW.nano, NEW.tokens, NEW.minute, NEW.day, NEW.month);
  SELECT RAISE(IGNORE);
END;
CREATE TRIGGER IF NOT EXISTS settle_request BEFORE INSERT ON settle BEGIN
  DELETE FROM reservations WHERE plugin = NEW.plugin AND id = NEW.id;
  INSERT INTO spend (plugin, bucket, nano, requests, tokens) VALUES
    (NEW.plugin, 'day:' || NEW.day, NEW.nano, 0, 0),
    (NEW.plugin, 'mon:' || NEW.month, NEW.nano, 0, 0),
    (NEW.plugin, 'min:' || NEW.minute, 0, 1, NEW.tokens)
    ON CONFLICT (plugin, bucket) DO UPDATE SET nano = MIN(nano + excluded.nano, @MAX@),
      requests = MIN(requests + excluded.requests, @MAX@), tokens = MIN(tokens + excluded.tokens, @MAX@);
  SELECT RAISE(IGNORE);
END;

CREATE TABLE IF NOT EXISTS lease (
    plugin TEXT, id TEXT, now REAL, expires REAL, minute TEXT, day TEXT, month TEXT,
    s_req INTEGER, s_tok INTEGER, s_nano INTEGER,
    k_slots INTEGER, k_req INTEGER, k_tok INTEGER, k_nano INTEGER,
    a_slots INTEGER, a_req INTEGER, a_tok INTEGER, a_nano INTEGER,
    w_slots INTEGER, w_req INTEGER, w_tok INTEGER, w_nano INTEGER,
    max_concurrent INTEGER, requests_per_minute INTEGER, tokens_per_minute INTEGER, budget_day INTEGER,
    budget_month INTEGER
);
CREATE TRIGGER IF NOT EXISTS lease_request BEFORE INSERT ON lease BEGIN
  INSERT INTO spend (plugin, bucket, nano, requests, tokens) SELECT * FROM (VALUES
    (NEW.plugin, 'day:' || NEW.day, NEW.s_nano, 0, 0),
    (NEW.plugin, 'mon:' || NEW.month, NEW.s_nano, 0, 0),
    (NEW.plugin, 'min:' || NEW.minute, 0, NEW.s_req, NEW.s_tok)) WHERE NEW.s_req + NEW.s_tok + NEW.s_nano > 0
    ON CONFLICT (plugin, bucket) DO UPDATE SET nano = MIN(nano + excluded.nano, @MAX@),
      requests = MIN(requests + excluded.requests, @MAX@), tokens = MIN(tokens + excluded.tokens, @MAX@);
  DELETE FROM reservations WHERE plugin = NEW.plugin AND expires <= NEW.now;
  SELECT CASE
      WHEN NEW.max_concurrent IS NOT NULL AND o_slots + NEW.k_slots + NEW.a_slots > NEW.max_concurrent
        THEN RAISE(ABORT, 'limit:1')
      WHEN NEW.requests_per_minute IS NOT NULL AND u_req + o_req + NEW.k_req + NEW.a_req > NEW.requests_per_minute
        THEN RAISE(ABORT, 'limit:2')
      WHEN NEW.tokens_per_minute IS NOT NULL AND u_tok + o_tok + NEW.k_tok + NEW.a_tok > NEW.tokens_per_minute
        THEN RAISE(ABORT, 'limit:3')
      WHEN NEW.budget_day IS NOT NULL AND u_day + o_day + NEW.k_nano + NEW.a_nano > NEW.budget_day
        THEN RAISE(ABORT, 'limit:4')
      WHEN NEW.budget_month IS NOT NULL AND u_mon + o_mon + NEW.k_nano + NEW.a_nano > NEW.budget_month
        THEN RAISE(ABORT, 'limit:5')
    END
    @TOTALS@ WHERE NEW.a_slots > 0;
  INSERT OR REPLACE INTO reservations (plugin, id, expires, nano, tokens, minute, day, month, slots, requests)
    SELECT NEW.plugin, NEW.id, NEW.expires,
      NEW.k_nano + NEW.a_nano + MAX(0, MIN(NEW.w_nano,
        CASE WHEN NEW.budget_day IS NULL AND NEW.budget_month IS NULL THEN 0
             ELSE MIN(COALESCE(NEW.budget_day - u_day - o_day, 9e18), COALESCE(NEW.budget_month - u_mon - o_mon, 9e18))
                  - NEW.k_nano - NEW.a_nano END / @SHARE@)),
      NEW.k_tok + NEW.a_tok + MAX(0, MIN(NEW.w_tok,
        COALESCE(NEW.tokens_per_minute - u_tok - o_tok - NEW.k_tok - NEW.a_tok, 0) / @SHARE@)),
      NEW.minute, NEW.day, NEW.month,
      NEW.k_slots + NEW.a_slots + MAX(0, MIN(NEW.w_slots,
        COALESCE(NEW.max_concurrent - o_slots - NEW.k_slots - NEW.a_slots, 0) / @SHARE@)),
      NEW.k_req + NEW.a_req + MAX(0, MIN(NEW.w_req,
        COALESCE(NEW.requests_per_minute - u_req - o_req - NEW.k_req - NEW.a_req, 0) / @SHARE@))
    @TOTALS@;
  DELETE FROM reservations WHERE plugin = NEW.plugin AND id = NEW.id
    AND slots = 0 AND requests = 0 AND tokens = 0 AND nano = 0;
  SELECT RAISE(IGNORE);
END;
""".replace("@TOTALS@", _TOTALS).replace("@SHARE@", str(LEASE_SHARE)).replace("@MAX@", str(MAX_TOTAL))

ADMIT = "INSERT INTO admit VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
#: the finished request in the buckets it was admitted in: cost to day and month, one request and its tokens to the minute
SETTLE = "INSERT INTO settle VALUES (?, ?, ?, ?, ?, ?, ?)"
#: many settlements (a JSON array of SETTLE rows) in one statement
SETTLE_MANY = (
    "INSERT INTO settle SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]'), "
    "json_extract(value, '$[3]'), json_extract(value, '$[4]'), json_extract(value, '$[5]'), json_extract(value, '$[6]') "
    "FROM json_each(?)"
)
#: every counter in one statement (one snapshot); reservations past their expiry (?5) are ignored
READ = """
SELECT COALESCE(SUM(CASE WHEN expires > ?5 THEN slots END), 0), MIN(CASE WHEN expires > ?5 THEN expires END),
       COALESCE(SUM(CASE WHEN expires > ?5 AND minute = ?2 THEN requests END), 0),
       COALESCE(SUM(CASE WHEN expires > ?5 AND minute = ?2 THEN tokens END), 0),
       COALESCE(SUM(CASE WHEN expires > ?5 AND day = ?3 THEN nano END), 0),
       COALESCE(SUM(CASE WHEN expires > ?5 AND month = ?4 THEN nano END), 0),
       (SELECT requests FROM spend WHERE plugin = ?1 AND bucket = 'min:' || ?2),
       (SELECT tokens FROM spend WHERE plugin = ?1 AND bucket = 'min:' || ?2),
       (SELECT nano FROM spend WHERE plugin = ?1 AND bucket = 'day:' || ?3),
       (SELECT nano FROM spend WHERE plugin = ?1 AND bucket = 'mon:' || ?4)
FROM reservations WHERE plugin = ?1
"""
LEASE = "INSERT INTO lease VALUES (" + ", ".join(["?"] * 27) + ")"
HELD = "SELECT slots, requests, tokens, nano, expires FROM reservations WHERE plugin = ? AND id = ?"
PRUNE_MINUTES = "DELETE FROM spend WHERE plugin = ? AND bucket >= 'min:' AND bucket < 'min:' || ?"
RESET = "DELETE FROM spend WHERE plugin = ?1 AND bucket IN ('min:' || ?2, 'day:' || ?3, 'mon:' || ?4)"
FORGOTTEN = """
SELECT (SELECT requests FROM spend WHERE plugin = ?1 AND bucket = 'min:' || ?2),
       (SELECT tokens FROM spend WHERE plugin = ?1 AND bucket = 'min:' || ?2),
       (SELECT nano FROM spend WHERE plugin = ?1 AND bucket = 'day:' || ?3),
       (SELECT nano FROM spend WHERE plugin = ?1 AND bucket = 'mon:' || ?4)
"""

BREAKER = "SELECT state, failures, first_failure, opened_at, retry_at FROM breakers WHERE route = ?"
#: the probe of an open breaker whose cooldown (or a half-open one whose probe lease) is over: one
#: statement, so of several callers exactly one changes the row and gets it
TAKE_PROBE = ("UPDATE breakers SET state = 'half_open', retry_at = ?1, updated = ?2 "
               "WHERE route = ?3 AND state IN ('open', 'half_open') AND retry_at <= ?2")
PUT_BREAKER = "INSERT OR REPLACE INTO breakers VALUES (?, ?, ?, ?, ?, ?, ?)"
#: a new route in a full table: the oldest closed breaker goes (else the oldest open one)
EVICT_BREAKER = ("DELETE FROM breakers WHERE route = "
                  "(SELECT route FROM breakers ORDER BY state <> 'closed', updated LIMIT 1)")
