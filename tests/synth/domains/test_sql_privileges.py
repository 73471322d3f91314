"""A sample's SQL never runs with more rights than it needs (issue 40): on real PostgreSQL and MariaDB,
with the servers' superuser DSN and with the README's minimum DSN, a schema, rows or query that tries
to run programs, write or read server files, list the data directory, create privileged roles or
users, stop other sessions, or outlive its time limit fails, leaves no trace, and leaves no backend,
scratch database, role or user behind."""

from __future__ import annotations

import os
import tempfile
import threading

import psycopg
import pymysql
import pytest

from synth.domains.sql_engines import Deadline, execute_on_mysql, execute_on_postgres, mysql_params
from tests.synth.domains.sql_servers import scratch_databases_left

DDL = "CREATE TABLE t (id INT PRIMARY KEY, name VARCHAR(20));"
ROWS = "INSERT INTO t VALUES (1, 'a'), (2, 'b');"


@pytest.fixture(params=["superuser", "minimum"])
def pg_admin(request, pg_dsn, pg_min_dsn) -> str:
    return pg_dsn if request.param == "superuser" else pg_min_dsn


@pytest.fixture(params=["superuser", "minimum"])
def mysql_admin(request, mysql_dsn, mysql_min_dsn) -> str:
    return mysql_dsn if request.param == "superuser" else mysql_min_dsn


@pytest.fixture
def marker():
    """A path the server's OS user could write (a world-writable directory): it must stay absent."""
    d = tempfile.mkdtemp(prefix="synth-escape-")
    os.chmod(d, 0o777)
    path = os.path.join(d, "pwned")
    yield path
    assert not os.path.exists(path), "the sample wrote a file on the server"
    os.rmdir(d)


@pytest.fixture
def pg_clean(pg_dsn):
    yield
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        backends = conn.execute("SELECT usename, query FROM pg_stat_activity WHERE usename LIKE 'synth\\_%'").fetchall()
        roles = conn.execute("SELECT rolname FROM pg_roles WHERE rolname LIKE 'evil%' OR rolsuper AND rolname <> 'synth'").fetchall()
    assert backends == [] and roles == []
    assert scratch_databases_left(pg=pg_dsn) == []


def _sleeper(setting: str) -> str:
    return (f"CREATE FUNCTION slow() RETURNS int LANGUAGE plpgsql {setting} AS $$ BEGIN PERFORM pg_sleep(900); "
            "RETURN 1; END $$;")


def _plpgsql(body: str) -> str:
    return f"CREATE FUNCTION evil() RETURNS int LANGUAGE plpgsql AS $$ BEGIN {body}; RETURN 1; END $$;"


PG_CASES = {   # name -> (schema, rows, query, expected status); {m} is the marker path
    "copy_to_program_in_rows": (DDL, ROWS + "COPY (SELECT 1) TO PROGRAM 'touch {m}';", "SELECT 1", "refused"),
    "copy_to_program_in_a_function": (DDL + _plpgsql("EXECUTE 'COPY (SELECT 1) TO PROGRAM ''touch {m}'''"), ROWS,
                                      "SELECT evil()", "error"),
    "superuser_role_in_schema": (DDL + "CREATE ROLE evil SUPERUSER LOGIN;", ROWS, "SELECT 1", "error"),
    "do_block_in_rows": (DDL, ROWS + "DO $$ BEGIN EXECUTE 'CREATE ROLE evil SUPERUSER'; END $$;", "SELECT 1", "refused"),
    "do_block_body_in_a_function": (DDL + _plpgsql("EXECUTE 'CREATE ROLE evil SUPERUSER'"), ROWS + "INSERT INTO t VALUES (evil(), 'x');",
                                    "SELECT 1", "error"),
    "lo_export": (DDL, ROWS, "SELECT lo_export(lo_from_bytea(0, 'x'), '{m}')", "error"),
    "pg_read_file": (DDL, ROWS, "SELECT pg_read_file('PG_VERSION')", "error"),
    "pg_ls_dir": (DDL, ROWS, "SELECT pg_ls_dir('.')", "error"),
    "pg_stat_file": (DDL, ROWS, "SELECT (pg_stat_file('postmaster.pid')).size", "error"),
    "statement_timeout_0_in_rows": (DDL, ROWS + "SET statement_timeout = 0; SELECT pg_sleep(900);", "SELECT 1", "refused"),
    "statement_timeout_0_in_the_query": (DDL, ROWS, "SELECT set_config('statement_timeout', '0', false), pg_sleep(900)", "timeout"),
    "statement_timeout_0_in_a_function": (DDL + _sleeper("SET statement_timeout = 0"), ROWS, "SELECT slow()", "timeout"),
    "sleep_while_loading": (DDL + _sleeper("SET statement_timeout = 0"), ROWS + "INSERT INTO t VALUES (slow(), 'x');",
                            "SELECT 1", "timeout"),
}


@pytest.mark.parametrize("case", sorted(PG_CASES))
def test_postgres_samples_run_without_rights(case, pg_admin, pg_dsn, marker, pg_clean):
    schema, rows, query, expected = (s.replace("{m}", marker) for s in PG_CASES[case])
    r = execute_on_postgres(query, schema, rows, pg_admin, timeout_s=1.0, load_timeout_s=1.0)
    assert r.status == expected, r
    if expected == "error":
        assert "permission denied" in r.error or "must be superuser" in r.error or "superuser" in r.error, r.error


def test_postgres_samples_cannot_stop_other_sessions(pg_admin, pg_clean):
    with psycopg.connect(pg_admin, autocommit=True) as bystander:       # a session of the DSN's own role
        pid = bystander.info.backend_pid
        for fn in ("pg_terminate_backend", "pg_cancel_backend"):
            r = execute_on_postgres(f"SELECT {fn}({pid})", DDL, ROWS, pg_admin)
            assert r.status == "error" and ("permission denied" in r.error or "must be" in r.error), r
        assert bystander.execute("SELECT 1").fetchone() == (1,)


def test_the_sample_role_holds_no_right(pg_admin, pg_clean):
    q = ("SELECT r.rolsuper, r.rolcreatedb, r.rolcreaterole, r.rolreplication, r.rolbypassrls, "
         "(SELECT count(*) FROM pg_auth_members m WHERE m.member = r.oid) FROM pg_roles r WHERE r.rolname = current_user")
    r = execute_on_postgres(q, DDL, ROWS, pg_admin)
    assert r.status == "ok" and r.rows_preview == [[0, 0, 0, 0, 0, 0]], r


def test_deadline_stops_a_statement_the_server_would_let_run(pg_dsn, pg_clean):
    """The limit holds from outside: a session with no statement_timeout is cancelled, then terminated."""
    with psycopg.connect(pg_dsn, autocommit=True) as admin, psycopg.connect(pg_dsn, autocommit=True) as victim:
        victim.execute("SET statement_timeout = 0")
        pid = victim.info.backend_pid
        with Deadline(0.5, lambda: None, lambda: admin.execute("SELECT pg_terminate_backend(%s, 5000)", [pid]),
                      grace_s=0.5) as d:
            with pytest.raises(psycopg.OperationalError):
                victim.execute("SELECT pg_sleep(900)")
        assert d.fired
        assert admin.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone() == (0,)


# ---- MariaDB ------------------------------------------------------------------------------------------------

@pytest.fixture
def mysql_clean(mysql_dsn):
    yield
    conn = pymysql.connect(**mysql_params(mysql_dsn))
    with conn.cursor() as cur:
        cur.execute("SELECT user, info FROM information_schema.PROCESSLIST WHERE user LIKE 'synth\\_%' OR user = 'evil'")
        threads = cur.fetchall()
        cur.execute("SELECT user FROM mysql.user WHERE user = 'evil'")
        users = cur.fetchall()
    conn.close()
    assert threads == () and users == ()
    assert scratch_databases_left(mysql=mysql_dsn) == []


MYSQL_CASES = {
    "into_outfile": (DDL, ROWS, "SELECT name FROM t INTO OUTFILE '{m}'", "error"),
    "into_dumpfile_in_rows": (DDL, ROWS + "SELECT 'x' INTO DUMPFILE '{m}';", "SELECT 1", "refused"),
    "create_user": (DDL + "CREATE USER evil IDENTIFIED BY 'x';", ROWS, "SELECT 1", "error"),
    "grant_in_schema": (DDL + "GRANT ALL ON *.* TO CURRENT_USER;", ROWS, "SELECT 1", "refused"),
    "sleep_past_the_limit": (DDL, ROWS, "SELECT SLEEP(900) FROM t", "timeout"),
}


@pytest.mark.parametrize("case", sorted(MYSQL_CASES))
def test_mariadb_samples_run_without_rights(case, mysql_admin, marker, mysql_clean):
    schema, rows, query, expected = (s.replace("{m}", marker) for s in MYSQL_CASES[case])
    r = execute_on_mysql(query, schema, rows, mysql_admin, timeout_s=1.0, load_timeout_s=1.0)
    assert r.status == expected, r
    if expected == "error":
        assert "denied" in r.error, r.error


def test_mariadb_samples_read_no_file_and_see_no_other_session(mysql_admin, mysql_clean):
    r = execute_on_mysql("SELECT LOAD_FILE('/etc/hostname') AS f", DDL, ROWS, mysql_admin)
    assert r.status == "ok" and r.rows_preview == [[None]], r          # no FILE privilege: NULL, nothing read
    bystander = pymysql.connect(autocommit=True, **mysql_params(mysql_admin))
    try:
        r = execute_on_mysql("SELECT user FROM information_schema.PROCESSLIST", DDL, ROWS, mysql_admin)
        assert r.status == "ok" and [u for [u] in r.rows_preview if not u.startswith("synth_")] == [], r   # no PROCESS
        r = execute_on_mysql("SHOW PROCESSLIST", DDL, ROWS, mysql_admin)
        assert r.status == "ok" and all(row[1].startswith("synth_") for row in r.rows_preview), r
        assert execute_on_mysql(f"KILL {bystander.thread_id()}", DDL, ROWS, mysql_admin).status == "refused"
        r = execute_on_mysql("SHOW GRANTS", DDL, ROWS, mysql_admin)
        grants = " ".join(g for [g] in r.rows_preview)
        assert r.status == "ok" and "ON *.*" in grants and "GRANT USAGE ON *.*" in grants, grants   # no global privilege
        for forbidden in ("FILE", "PROCESS", "SUPER", "CREATE USER", "GRANT OPTION"):
            assert forbidden not in grants, grants
        bystander.ping(reconnect=False)
    finally:
        bystander.close()


# ---- a worker that died before its own cleanup ----------------------------------------------------------------

def _in_thread(fn) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as e:          # the session is killed under it: expected
            errors.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, errors


def test_drop_scratch_stops_and_removes_what_a_dead_worker_left(pg_dsn, mysql_dsn, pg_clean, mysql_clean):
    """execute_isolated drops a scratch itself when its worker dies: even with a statement still running."""
    from psycopg import conninfo

    from synth.domains import sql_engines as se

    name, password = se.scratch_name(), "pw"
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        se._pg_create_scratch(admin, name, password)
    sample = psycopg.connect(conninfo.make_conninfo(pg_dsn, dbname=name, user=name, password=password), autocommit=True)
    pg_thread, pg_errors = _in_thread(lambda: sample.execute("SELECT pg_sleep(900)"))
    admin = pymysql.connect(autocommit=True, **mysql_params(mysql_dsn))
    account = se._mysql_account(admin, name)
    se._mysql_create_scratch(admin, name, account, password)
    admin.close()
    mysample = pymysql.connect(**{**mysql_params(mysql_dsn), "user": name, "password": password, "database": name})
    with mysample.cursor() as cur:
        cur.execute(DDL)
        cur.execute(ROWS)
    my_thread, my_errors = _in_thread(lambda: mysample.cursor().execute("SELECT SLEEP(900) FROM t"))   # holds a table lock
    se.drop_scratch("postgres", pg_dsn, name)
    se.drop_scratch("mysql", mysql_dsn, name)
    pg_thread.join(30)
    my_thread.join(30)
    assert not pg_thread.is_alive() and not my_thread.is_alive() and pg_errors and my_errors
    assert scratch_databases_left(pg=pg_dsn, mysql=mysql_dsn) == []
    sample.close()
    mysample.close()
