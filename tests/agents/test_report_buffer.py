"""The flush thread of buffered agent reports: started by the agents app when the setting asks for it, never by an
import, and once per process."""

from django.apps import apps

from agents.report_buffer import ReportBuffer, report_buffer


def test_the_app_starts_the_flush_thread_only_when_reports_are_buffered(settings, monkeypatch):
    started = []
    monkeypatch.setattr(ReportBuffer, "start", lambda buffer, interval: started.append((buffer, interval)))
    settings.TESSERA = {**settings.TESSERA, "AGENT_REPORT_FLUSH_SECONDS": 0}
    apps.get_app_config("agents").ready()
    assert started == []
    settings.TESSERA = {**settings.TESSERA, "AGENT_REPORT_FLUSH_SECONDS": 0.5}
    apps.get_app_config("agents").ready()
    assert started == [(report_buffer, 0.5)]


def test_pytest_writes_reports_at_once_so_no_thread_runs():
    assert report_buffer.thread is None


def test_a_buffer_runs_one_flush_thread():
    buffer = ReportBuffer()
    buffer.start(3600)
    thread = buffer.thread
    buffer.start(1)
    assert buffer.thread is thread and thread.is_alive() and thread.daemon
    assert buffer.interval == 3600 and thread.name == "agent-report-flush"
