from django.contrib import admin

from scheduling.models import Schedule, ScheduleException, ScheduleWindow


class ScheduleWindowInline(admin.TabularInline):
    model = ScheduleWindow
    extra = 0


class ScheduleExceptionInline(admin.TabularInline):
    model = ScheduleException
    extra = 0


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin):
    """For support; edits here skip the overlap check — use the UI or API for changes."""

    list_display = ("name", "pool", "time_zone", "baseline_profile", "busy_policy", "enabled")
    list_filter = ("enabled", "time_zone")
    inlines = [ScheduleWindowInline, ScheduleExceptionInline]
