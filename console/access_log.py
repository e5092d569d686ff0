"""gunicorn's logger for `make run`: the access log goes to a file that rotates at a size, so a stack left running
for weeks never fills the disk (`--logger-class console.access_log.BoundedAccessLog --access-logfile PATH`)."""

from logging.handlers import RotatingFileHandler

from gunicorn.glogging import Logger

MAX_BYTES = 10 * 1024 * 1024
BACKUPS = 1  # access.log and access.log.1: at most 20 MB


class BoundedAccessLog(Logger):
    """As gunicorn's own, but a file access log is a RotatingFileHandler: each worker rolls the file over when it
    passes MAX_BYTES (a line may land in the older file around a roll-over; the total stays bounded)."""

    def _set_handler(self, log, output, fmt, stream=None):
        if log is not self.access_log or output in (None, "-"):
            return super()._set_handler(log, output, fmt, stream)
        old = self._get_gunicorn_handler(log)
        if old:
            log.removeHandler(old)
        handler = RotatingFileHandler(output, maxBytes=MAX_BYTES, backupCount=BACKUPS)
        handler.setFormatter(fmt)
        handler._gunicorn = True  # what gunicorn's setup removes on a reload
        log.addHandler(handler)
        return None
